"""What the API does the moment it is told to stop (Ctrl-C, SIGTERM), before its server
waits for open connections: the interactive calls whose jobs have not started are answered
(``gpuq.dropin.shutdown``), so the wait ends."""

from __future__ import annotations

import asyncio
import logging

from fastapi import FastAPI

from api.deps import AppState
from gpuq.dropin.shutdown import cancel_waiting_calls

log = logging.getLogger(__name__)


def on_stop_signal(app: FastAPI, loop: asyncio.AbstractEventLoop) -> None:
    """Called from the server's signal handler, on the event loop's thread: the answering is
    scheduled on the loop (``call_soon_threadsafe`` also wakes it)."""
    state: AppState | None = getattr(app.state, "gpuq", None)
    if state is None or not state.calls:
        return

    def start() -> None:
        task = loop.create_task(_answer_waiting_calls(state))
        _tasks.add(task)
        task.add_done_callback(_tasks.discard)

    loop.call_soon_threadsafe(start)


_tasks: set[asyncio.Task[None]] = set()  # held until done: the loop keeps only weak references


async def _answer_waiting_calls(state: AppState) -> None:
    try:
        await cancel_waiting_calls(state.sessions, state.redis, set(state.calls))
    except Exception:
        log.exception("could not answer the calls waiting in the queue; they end when their jobs do")
