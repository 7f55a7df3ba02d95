"""One large request body at a time per API key, from before it is read until it is answered.

Reading, parsing and validating a JSON body of hundreds of kilobytes (a conversation of
10,000 messages) takes tens of milliseconds of the event loop, which every other call in
the process shares. Four such requests kept in flight by one key kept the loop busy enough
to hold another tenant's streamed call for seconds, even though each was refused. So a
large body (over ``LARGE_BODY_BYTES``, or of unknown length) waits, before anything reads
it, until the same key has no other large body in its turn; the turn ends when the call's
job is submitted (``end_turn``, from api/calls.py), when the answer starts, or when the
request ends: a call holds it through its checks and tokenising, never its generation.
Ordinary requests, small bodies, and uploads (under ``upload_prefix``, streamed to disk)
never wait. Requests without a key share one turn.

A large body that is refused (a 4xx: too many messages, a prompt that cannot fit, a key
over its limits) keeps its key's turn ``REFUSED_COOLDOWN`` times as long again as it took:
a key that keeps sending what gpuq refuses gets a small share of the loop, not all of it,
while its accepted work is not slowed.

Keys are told apart by a hash of their ``Authorization`` and ``x-api-key`` headers, in this process only: the
turn needs no database, and runs before the key is checked.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from contextvars import ContextVar

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LARGE_BODY_BYTES = 64 * 1024
REFUSED_COOLDOWN = 3.0  # a refused large body's time, again this many times, before the key's next
_WITH_BODY = ("POST", "PUT", "PATCH")


# The running request's way to end its turn early (None outside a large body's request).
_end_turn: ContextVar[Callable[[], None] | None] = ContextVar("gpuq_large_body_turn", default=None)


def end_turn() -> None:
    """The request's costly part is over (its job is submitted): the key's next large body
    may be read. Does nothing for a request that holds no turn."""
    end = _end_turn.get()
    if end is not None:
        end()


class _Turn:
    """A key's lock and how many requests hold or wait for it (the entry goes at zero)."""

    def __init__(self) -> None:
        self.lock = anyio.Lock()
        self.users = 0


class LargeBodyTurnsMiddleware:
    def __init__(self, app: ASGIApp, *, upload_prefix: str) -> None:
        self.app = app
        self.upload_prefix = upload_prefix
        self._turns: dict[str, _Turn] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._is_large(scope):
            await self.app(scope, receive, send)
            return
        holder = self._holder(scope)
        turn = self._turns.setdefault(holder, _Turn())
        turn.users += 1
        try:
            await turn.lock.acquire()
            started, held, refused_s = time.monotonic(), True, 0.0

            def release() -> None:
                nonlocal held
                if held:
                    held = False
                    turn.lock.release()

            async def send_releasing(message: Message) -> None:
                nonlocal refused_s
                if message["type"] == "http.response.start" and held:
                    if 400 <= message["status"] < 500:
                        refused_s = time.monotonic() - started  # released after the cooldown
                    else:
                        release()
                await send(message)

            token = _end_turn.set(release)
            try:
                await self.app(scope, receive, send_releasing)
            finally:
                _end_turn.reset(token)
                if held:
                    with anyio.CancelScope(shield=True):
                        await anyio.sleep(refused_s * REFUSED_COOLDOWN)
                    release()
        finally:
            turn.users -= 1
            if turn.users == 0:
                del self._turns[holder]

    def _is_large(self, scope: Scope) -> bool:
        if scope["type"] != "http" or scope.get("method") not in _WITH_BODY:
            return False
        if str(scope.get("path", "")).startswith(self.upload_prefix):
            return False
        declared = dict(scope.get("headers", ())).get(b"content-length")
        return declared is None or not declared.isdigit() or int(declared) > LARGE_BODY_BYTES

    @staticmethod
    def _holder(scope: Scope) -> str:
        headers = dict(scope.get("headers", ()))
        key = headers.get(b"authorization", b"") + b"\n" + headers.get(b"x-api-key", b"")  # either carries the key
        return hashlib.sha256(key).hexdigest()
