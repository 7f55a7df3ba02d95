"""Webhooks on job and batch completion: signed, retried with backoff, logged in SQL.

An event is first a row (``webhook_deliveries``), written in the same transaction as
the state change it reports, so a crash cannot lose it. The scheduler sends due rows from
a small pool of threads (``DeliveryPool``), off its tick: each attempt is claimed by a
conditional UPDATE (so two schedulers do not both send it), POSTed with an HMAC-SHA256
signature, and on failure retried after 2, 4, 8 ... seconds (at most an hour apart) until
``MAX_ATTEMPTS``.

Each attempt first checks the destination again (gpuq/batches/destinations.py): one that
now resolves to an internal address fails for good, before any connection. The log
records a status and an error class (``HTTP 500``, ``ConnectTimeout``), never what the
receiver answered, because submitters read it and the receiver may be none of theirs.

Verifying a delivery (receiver side)::

    expected = hmac.new(secret, f"{timestamp}.".encode() + body, sha256).hexdigest()
    ok = hmac.compare_digest(f"sha256={expected}", request.headers["X-Gpuq-Signature"])

where ``timestamp`` is the ``X-Gpuq-Timestamp`` header (reject old ones to stop replays).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import secrets
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path

import httpx
from sqlalchemy.orm import Session, sessionmaker

from gpuq.batches.destinations import Destination, DestinationPolicy, RefusedDestination, redact_url
from gpuq.db.tables import utcnow
from gpuq.private_files import private_dir, write_private
from gpuq.store import webhooks as store

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 8
MAX_BACKOFF_S = 3600
TIMEOUT_S = 10.0
CLAIM_S = 60  # an attempt in flight is not picked up again for this long
BATCH_SIZE = 50


def load_secret(configured: str, data_dir: Path) -> bytes:
    """GPUQ_WEBHOOK_SECRET, or one generated once and kept in the data directory."""
    if configured:
        return configured.encode()
    path = data_dir / "webhook_secret"
    if not path.exists():
        private_dir(path.parent)
        write_private(path, secrets.token_hex(32).encode())
    return path.read_text().strip().encode()


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def backoff_s(attempts: int) -> int:
    return int(min(MAX_BACKOFF_S, 2**attempts))


def claim_due(session: Session, *, now: datetime | None = None, limit: int = BATCH_SIZE) -> list[str]:
    """Claim up to ``limit`` due deliveries for one attempt each; returns their ids. A claimed
    delivery is not due again for ``CLAIM_S``, so its attempt must start within that time."""
    return store.claim_due_deliveries(session, now=now or utcnow(), limit=limit, claim_for=timedelta(seconds=CLAIM_S))


def deliver_due(
    session: Session,
    secret: bytes,
    *,
    policy: DestinationPolicy,
    now: datetime | None = None,
    client: httpx.Client | None = None,
) -> list[str]:
    """Send the deliveries that are due (up to ``BATCH_SIZE``) one after the other, each
    claimed just before its attempt; returns the ids delivered this time. The scheduler
    sends from a ``DeliveryPool`` instead."""
    now = now or utcnow()
    delivered = []
    for _ in range(BATCH_SIZE):
        claimed = claim_due(session, now=now, limit=1)
        if not claimed:
            break  # a claimed or retried delivery is not due again at ``now``
        if send(session, claimed[0], secret, policy=policy, now=now, client=client):
            delivered.append(claimed[0])
    return delivered


_LEGACY_ERROR = re.compile(r"^(HTTP \d{3}|[A-Za-z]+): ")


def error_class(last_error: str | None) -> str | None:
    """A delivery's error as submitters may see it. Rows logged before errors were recorded
    as classes held the receiver's answer (``HTTP 500: <body>``) or the exception's text:
    only their class is shown."""
    if last_error is None:
        return None
    legacy = _LEGACY_ERROR.match(last_error)
    return legacy.group(1) if legacy else last_error


def _post(client: httpx.Client, destination: Destination, body: bytes, headers: dict[str, str]) -> httpx.Response:
    """POST to the checked address itself, as the URL's host (``Host``, TLS server name)."""
    url = httpx.URL(destination.url)
    extensions = {"sni_hostname": destination.host} if url.scheme == "https" else {}
    return client.post(
        url.copy_with(host=destination.address),
        content=body,
        headers=headers | {"Host": url.netloc.decode()},
        extensions=extensions,
    )


def _attempt(
    destination: Destination, body: bytes, headers: dict[str, str], client: httpx.Client | None
) -> tuple[bool, int | None, str | None]:
    """(accepted, HTTP status, error class) of one POST."""
    try:
        if client is None:
            with httpx.Client(timeout=TIMEOUT_S, follow_redirects=False) as own:
                response = _post(own, destination, body, headers)
        else:
            response = _post(client, destination, body, headers)
    except httpx.HTTPError as exc:
        log.info("webhook to %s: %s: %s", redact_url(destination.url), type(exc).__name__, exc)
        return False, None, type(exc).__name__
    if response.is_success:
        return True, response.status_code, None
    return False, response.status_code, f"HTTP {response.status_code}"  # the body stays unread


def send(
    session: Session,
    delivery_id: str,
    secret: bytes,
    *,
    policy: DestinationPolicy,
    now: datetime | None = None,
    client: httpx.Client | None = None,
) -> bool:
    """One attempt at a claimed delivery: check its destination, POST it and record the
    outcome (delivered, retried after a backoff, or failed for good). Returns whether the
    receiver accepted it."""
    now = now or utcnow()
    delivery = store.delivery_to_send(session, delivery_id)
    if delivery is None:
        return False  # deleted since it was claimed
    try:
        destination = policy.check(delivery.url)
    except RefusedDestination as exc:
        log.warning("webhook %s to %s refused: %s", delivery.id, redact_url(delivery.url), exc)
        store.record_delivery_failed(session, delivery, status_code=None, error=f"destination refused: {exc}")
        return False
    body = json.dumps(
        {"id": delivery.id, "event": delivery.event, "data": delivery.payload}, separators=(",", ":")
    ).encode()
    timestamp = str(int(now.timestamp()))
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "gpuq-webhooks",
        "X-Gpuq-Event": delivery.event,
        "X-Gpuq-Delivery": delivery.id,
        "X-Gpuq-Timestamp": timestamp,
        "X-Gpuq-Signature": sign(secret, timestamp, body),
    }
    ok, status_code, error = _attempt(destination, body, headers, client)
    if ok:
        store.record_delivered(session, delivery, status_code=status_code, at=now)
    elif delivery.attempts >= MAX_ATTEMPTS:
        log.warning("webhook %s to %s failed for good: %s", delivery.id, redact_url(delivery.url), error)
        store.record_delivery_failed(session, delivery, status_code=status_code, error=error)
    else:
        retry_at = now + timedelta(seconds=backoff_s(delivery.attempts))
        store.record_delivery_retry(session, delivery, status_code=status_code, error=error, at=retry_at)
    return ok


class DeliveryPool:
    """Sends due deliveries from ``threads`` threads of its own, so that a slow receiver (up
    to ``TIMEOUT_S`` an attempt) holds up one of them, not the scheduler's tick.

    ``dispatch`` claims only as many deliveries as there are idle threads: each attempt then
    starts at once, well within its claim (``CLAIM_S``); one left waiting in a queue could see
    its claim lapse and be sent twice. Claiming stays the conditional UPDATE, so several
    schedulers, each with its pool, still send every attempt once."""

    def __init__(
        self, sessions: sessionmaker[Session], secret: bytes, *, threads: int, policy: DestinationPolicy
    ) -> None:
        self._sessions = sessions
        self._secret = secret
        self._policy = policy
        self._threads = threads
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="webhook")
        self._lock = threading.Lock()
        self._busy = 0

    def dispatch(self) -> int:
        """Claim due deliveries for the idle threads and hand them over; returns how many."""
        with self._lock:
            idle = self._threads - self._busy
        if idle <= 0:
            return 0
        with self._sessions() as session:
            claimed = claim_due(session, limit=idle)
        for delivery_id in claimed:
            with self._lock:
                self._busy += 1
            self._executor.submit(self._send, delivery_id)
        return len(claimed)

    def _send(self, delivery_id: str) -> None:
        try:
            with self._sessions() as session:
                send(session, delivery_id, self._secret, policy=self._policy)
        except Exception:
            # The database failed under us: the claim lapses after CLAIM_S and the attempt is made again.
            log.exception("webhook %s: the attempt could not be recorded; it will be retried", delivery_id)
        finally:
            with self._lock:
                self._busy -= 1

    def close(self) -> None:
        """Stop taking work; attempts in flight finish in the background (at most ``TIMEOUT_S``)."""
        self._executor.shutdown(wait=False, cancel_futures=True)
