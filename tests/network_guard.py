"""Tests that touch webhook destinations send nothing off this machine, and prove it.

``StubResolver`` stands in for DNS (gpuq/batches/destinations.py's ``Resolve`` seam): names
resolve to whatever the test says, and can change between calls (rebinding).
``guarded_network`` records every TCP connection and name lookup the process attempts;
one to an address off loopback, or a lookup of any name, raises before it happens.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

# A public address (example.com's), handed out by stubs; no test may connect to it, and the guard refuses it.
PUBLIC_ADDRESS = "93.184.215.14"


@dataclass
class StubResolver:
    answers: dict[str, list[str]] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)

    def __call__(self, host: str) -> list[str]:
        self.asked.append(host)
        if host not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, f"{host} is not in the test's stub resolver")
        return list(self.answers[host])


@dataclass
class Network:
    """What the process tried while guarded: (host, port) connections and names looked up."""

    connections: list[tuple[str, int]] = field(default_factory=list)
    lookups: list[str] = field(default_factory=list)

    def connections_to(self, port: int) -> list[tuple[str, int]]:
        return [c for c in self.connections if c[1] == port]


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


@contextmanager
def guarded_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[Network]:
    network = Network()
    real_connect, real_connect_ex, real_getaddrinfo = (
        socket.socket.connect,
        socket.socket.connect_ex,
        socket.getaddrinfo,
    )

    def check(address: object) -> None:
        if isinstance(address, tuple):
            host, port = str(address[0]), int(address[1])
            network.connections.append((host, port))
            if not _is_loopback(host):
                raise AssertionError(f"a test tried to connect to {host}:{port}, off this machine")

    def connect(sock: socket.socket, address: object) -> None:
        check(address)
        real_connect(sock, address)  # type: ignore[arg-type]

    def connect_ex(sock: socket.socket, address: object) -> int:
        check(address)
        return real_connect_ex(sock, address)  # type: ignore[arg-type]

    def getaddrinfo(host: object, *args: object, **kwargs: object) -> list:
        name = host.decode() if isinstance(host, bytes) else str(host)
        try:
            ipaddress.ip_address(name.split("%", 1)[0])
        except ValueError:
            network.lookups.append(name)
            raise AssertionError(f"a test looked up {name!r} in DNS; use a StubResolver") from None
        return real_getaddrinfo(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield network
