"""Where webhooks may be sent: public addresses, and what an admin allows beyond them.

A webhook URL is the submitter's, but the request is gpuq's: it leaves from inside the
network the scheduler runs in. Unchecked, a submitter could point it at the API itself,
at Redis, or at a cloud metadata service, and read the answer back from the delivery log.
So by default a destination must be public: a host name is resolved and every address it
resolves to must be global (not loopback, link-local, private, unique-local, shared,
reserved or multicast; IPv4 inside IPv6, ``::ffff:10.0.0.1``, is judged as the IPv4).
``GPUQ_WEBHOOK_ALLOWED_HOSTS`` (comma-separated host names, ``*.suffix`` patterns,
addresses or CIDR ranges) lets an admin allow receivers on the inside.

The check runs when a URL is submitted (a clear 422 at once) and again before every
delivery attempt, because DNS may answer differently by then (rebinding). The attempt then
connects to the address just checked, not to a second lookup's answer: the URL's host is
replaced by that address, with the ``Host`` header and TLS server name kept as the host
name, so certificates are still verified against it.

Names are resolved through ``Resolve``, a seam: tests give a stub, so that no test sends a
DNS query, or anything else, off the machine.

URLs may carry credentials (``https://user:secret@host/``, sent as Basic auth):
``redact_url`` hides them wherever a URL is logged or shown.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from gpuq.errors import RequestError

log = logging.getLogger(__name__)

# A host name -> the addresses it resolves to (strings); OSError when it does not resolve.
Resolve = Callable[[str], list[str]]
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
NAT64 = ipaddress.ip_network("64:ff9b::/96")  # IPv4 reached through a NAT64 gateway
SETTING = "GPUQ_WEBHOOK_ALLOWED_HOSTS"


def system_resolve(host: str) -> list[str]:
    """The addresses the system's resolver gives for ``host`` (TCP), each once."""
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


class RefusedDestination(Exception):
    """The URL may not be sent to; the message says why, without the resolved addresses."""


def _embedded_ipv4(address: IPAddress) -> IPAddress:
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def _address_literal(host: str) -> IPAddress | None:
    """The address a host written as one stands for, in any form the C library reads
    (``127.1``, ``0x7f000001``, ``0177.0.0.1`` are all 127.0.0.1), or None for a name."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def internal_kind(address: IPAddress) -> str | None:
    """What kind of non-public address this is ("loopback", "private", ...), or None if public."""
    address = _embedded_ipv4(address)
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_unspecified:
        return "unspecified"
    if address.is_multicast:
        return "multicast"
    if isinstance(address, ipaddress.IPv6Address) and address in ipaddress.ip_network("fc00::/7"):
        return "unique-local"
    if address.is_private:
        return "private"
    if not address.is_global:
        return "non-public"
    return None


def redact_url(url: str) -> str:
    """``url`` with any user name and password replaced by ``***``: for logs and responses."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<invalid URL>"
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"***@{host}"))


@dataclass(frozen=True)
class Destination:
    """A checked URL and the address to connect to for it."""

    url: str
    host: str  # as in the URL, lower case, IPv6 without brackets
    address: str


@dataclass(frozen=True)
class DestinationPolicy:
    allowed_hosts: frozenset[str] = frozenset()  # lower-case names; "*.example.com" matches below it
    allowed_networks: tuple[IPNetwork, ...] = ()
    resolve: Resolve = field(default=system_resolve, compare=False)

    @classmethod
    def from_setting(cls, text: str, *, resolve: Resolve = system_resolve) -> DestinationPolicy:
        """From ``GPUQ_WEBHOOK_ALLOWED_HOSTS``: ``hooks.internal, *.corp.example, 10.2.0.0/16, 127.0.0.1``."""
        hosts, networks = set(), []
        for entry in (e.strip() for e in text.split(",")):
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            except ValueError:
                hosts.add(entry.lower().rstrip("."))
        return cls(frozenset(hosts), tuple(networks), resolve)

    def _host_allowed(self, host: str) -> bool:
        return host in self.allowed_hosts or any(
            pattern.startswith("*.") and host.endswith(pattern[1:]) for pattern in self.allowed_hosts
        )

    def _refusal(self, address: IPAddress) -> str | None:
        if any(address in network for network in self.allowed_networks):
            return None
        return internal_kind(address)

    def check(self, url: str) -> Destination:
        """The destination for ``url``, or RefusedDestination saying why it may not be used."""
        try:
            parts = urlsplit(url)
            host = (parts.hostname or "").rstrip(".")
            parts.port  # noqa: B018  # raises ValueError for a port out of range
        except ValueError as exc:
            raise RefusedDestination(f"it is not a valid URL ({exc})") from None
        if parts.scheme not in ("http", "https") or not host:
            raise RefusedDestination("it must be an http:// or https:// URL with a host")
        literal = _address_literal(host)
        addresses = [literal] if literal is not None else self._resolve(host)
        if not self._host_allowed(host):
            for address in addresses:
                kind = self._refusal(address)
                if kind is not None:
                    log.info("webhook destination %s refused: %s is %s", redact_url(url), address, kind)
                    where = "is" if str(address) == host else "resolves to"
                    raise RefusedDestination(
                        f"its host {where} a {kind} address; gpuq sends webhooks to public addresses only "
                        f"(an admin can allow others with {SETTING})"
                    )
        return Destination(url, host, str(addresses[0]))

    def _resolve(self, host: str) -> list[IPAddress]:
        try:
            found = [ipaddress.ip_address(a.split("%", 1)[0]) for a in self.resolve(host)]
        except (OSError, UnicodeError, ValueError):
            found = []
        if not found:
            raise RefusedDestination(f"its host {host!r} does not resolve to an address")
        return found


def check_webhook_url(policy: DestinationPolicy, url: str | None) -> None:
    """A submitted ``webhook_url`` that may be sent to, or a 422 saying why not."""
    if url is None:
        return
    try:
        policy.check(url)
    except RefusedDestination as exc:
        raise RequestError(
            422, f"webhook_url {redact_url(url)!r} is refused: {exc}", param="webhook_url", code="invalid_value"
        ) from None
