"""How `gpuq up` and `gpuq api` serve the API with uvicorn.

The port is taken first (``listen``), so a port already in use ends the command in one line
with a hint, before `gpuq up` runs migrations, starts workers or prints a new admin key; the
bound socket is then handed to uvicorn, so nothing can take the port in between.

`gpuq up` runs in someone's terminal, where the dashboard's polling (several GETs every 5 s
per open tab) would bury everything else, so its access log leaves out reads that succeeded
(``QuietReads``); writes and every error are still logged, and ``--access-log`` shows all.
`gpuq api` logs every request, as a server behind a log collector should.

Told to stop, uvicorn waits for every open connection; the API is told at once
(``api.shutdown``), so interactive calls still waiting in the queue are answered instead of
holding the exit forever."""

from __future__ import annotations

import asyncio
import copy
import errno
import logging
import socket
from collections.abc import Callable
from contextlib import suppress
from types import FrameType
from typing import TYPE_CHECKING, Any

from gpuq.cli.errors import stop

if TYPE_CHECKING:
    import uvicorn

READS = frozenset({"GET", "HEAD", "OPTIONS"})


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port for uvicorn, or the command ends saying why not."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a restart is not refused
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            stop(
                f"port {port} on {host} is in use (another `gpuq up` or `gpuq api`?): stop that process, "
                f"or choose another port with --port or GPUQ_API_PORT"
            )
        stop(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    return sock


class QuietReads(logging.Filter):
    """Drops uvicorn's access-log lines for reads that succeeded (status below 400)."""

    def filter(self, record: logging.LogRecord) -> bool:
        # uvicorn's access record: '%s - "%s %s HTTP/%s" %d' % (client, method, path, version, status)
        args = record.args
        if isinstance(args, tuple) and len(args) == 5:
            method, status = args[1], args[4]
            return not (method in READS and isinstance(status, int) and status < 400)
        return True


def server(
    app: Any,
    sock: socket.socket,
    *,
    quiet_reads: bool,
    on_stop: Callable[[asyncio.AbstractEventLoop], None] | None = None,
) -> uvicorn.Server:
    """A uvicorn server for the app on the bound socket (``run(sockets=[sock])`` runs it), its
    access log without successful reads when ``quiet_reads``: a filter in uvicorn's own
    logging configuration, so nothing global is patched. ``on_stop`` is called with the
    event loop at the first Ctrl-C or SIGTERM, before the server waits for open connections."""
    import uvicorn
    from uvicorn.config import LOGGING_CONFIG

    log_config = copy.deepcopy(LOGGING_CONFIG)
    if quiet_reads:
        log_config["filters"] = {"quiet_reads": {"()": QuietReads}}
        log_config["handlers"]["access"]["filters"] = ["quiet_reads"]
    host, port = sock.getsockname()[:2]

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            first = not self.should_exit
            super().handle_exit(sig, frame)
            if first and on_stop is not None:
                # A signal handler runs on the main thread, inside the running loop (if any yet).
                with suppress(RuntimeError):
                    on_stop(asyncio.get_running_loop())

    return Server(uvicorn.Config(app, host=host, port=port, log_level="info", log_config=log_config))


def serve(app: Any, sock: socket.socket, *, quiet_reads: bool) -> None:
    """Run the app on the bound socket until Ctrl-C (or SIGTERM)."""
    from api.shutdown import on_stop_signal

    api = server(app, sock, quiet_reads=quiet_reads, on_stop=lambda loop: on_stop_signal(app, loop))
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    # uvicorn announces its address only for sockets it bound itself.
    announce = "gpuq API on http://%s:%d, the dashboard at /dashboard (Ctrl-C stops)"
    logging.getLogger("uvicorn.error").info(announce, shown, port)
    api.run(sockets=[sock])
