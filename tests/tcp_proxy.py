"""A TCP proxy on loopback between gpuq and its database, for faults a server stop cannot
make: a connection that breaks right after the client's COMMIT has reached the server, so
the transaction commits but the client never hears so (a lost acknowledgement).

Bytes pass through unchanged. ``lose_reply_to_commit_after(marker)`` arms a trap for the
next connection whose client sends ``marker`` (a piece of SQL text) and then a ``COMMIT``:
the COMMIT is forwarded, the server's reply is dropped, and both sides are closed.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from gpuq.local.redis_server import free_port

CHUNK = 65536
COMMIT_SETTLE_S = 0.3  # time for the server to run the COMMIT before the connection is cut


class TcpProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = free_port()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._marker: bytes | None = None
        self._lock = threading.Lock()
        self.tripped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def lose_reply_to_commit_after(self, marker: bytes) -> None:
        with self._lock:
            self._marker = marker
            self.tripped.clear()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            state = _Connection(client, server)
            threading.Thread(target=self._client_to_server, args=(state,), daemon=True).start()
            threading.Thread(target=self._server_to_client, args=(state,), daemon=True).start()

    def _client_to_server(self, conn: _Connection) -> None:
        while data := _recv(conn.client):
            with self._lock:
                if self._marker is not None and self._marker in data:
                    conn.armed, self._marker = True, None
            if conn.armed and b"COMMIT" in data:
                conn.silenced = True  # from now on nothing the server says reaches the client
                _send(conn.server, data)
                time.sleep(COMMIT_SETTLE_S)
                conn.close()
                self.tripped.set()
                return
            _send(conn.server, data)
        conn.close()

    def _server_to_client(self, conn: _Connection) -> None:
        while data := _recv(conn.server):
            if conn.silenced:
                continue
            _send(conn.client, data)
        conn.close()


class _Connection:
    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.armed = False
        self.silenced = False

    def close(self) -> None:
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(CHUNK)
    except OSError:
        return b""


def _send(sock: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):
        sock.sendall(data)
