"""Webhooks to a real HTTP receiver on loopback: signed, retried with backoff, logged."""

import hashlib
import hmac
import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpuq import store
from gpuq.batches.destinations import DestinationPolicy
from gpuq.batches.webhooks import MAX_ATTEMPTS, backoff_s, deliver_due, load_secret
from gpuq.db.tables import JobStatus, WebhookDelivery, utcnow
from tests.conftest import both_databases
from tests.gpuq.store.test_store import make_job

SECRET = b"test-secret"
# These receivers listen on loopback, which gpuq refuses unless an admin allows it.
LOOPBACK = DestinationPolicy.from_setting("127.0.0.0/8")


@pytest.fixture
def receiver():
    """A loopback HTTP server answering with the scripted statuses, recording what it got."""
    received, script = [], []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((dict(self.headers), body))
            self.send_response(script.pop(0) if script else 200)
            self.end_headers()

        def log_message(self, *args):
            """Keep the test output quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hook", received, script
    server.shutdown()


def finish_job(session, url):
    [job] = store.insert_jobs(session, [make_job()])
    store.claim_job(session, job.id, worker="w", device="cpu")
    outcome = store.Outcome(
        job.id, "w", JobStatus.SUCCEEDED, utcnow(), result={"text": "ok"}, completion_tokens=2, webhook_url=url
    )
    store.record_outcomes(session, [outcome])
    return job.id


@both_databases
def test_a_finished_job_posts_a_signed_event_retried_after_a_failure(session, receiver):
    url, received, script = receiver
    job_id = finish_job(session, url)
    script.append(500)  # the receiver is down the first time
    now = utcnow()
    assert deliver_due(session, SECRET, policy=LOOPBACK, now=now) == []
    [delivery] = store.list_deliveries(session, job_id=job_id, batch_id=None, limit=10)
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("pending", 1, 500)
    assert delivery.next_attempt_at == now + timedelta(seconds=backoff_s(1))
    assert deliver_due(session, SECRET, policy=LOOPBACK, now=now + timedelta(seconds=1)) == []  # not due yet
    assert deliver_due(session, SECRET, policy=LOOPBACK, now=now + timedelta(seconds=3)) == [delivery.id]

    headers, body = received[-1]
    event = json.loads(body)
    assert event["event"] == "job.succeeded" and event["data"]["job_id"] == job_id
    assert event["data"]["completion_tokens"] == 2
    expected = hmac.new(SECRET, headers["X-Gpuq-Timestamp"].encode() + b"." + body, hashlib.sha256).hexdigest()
    assert headers["X-Gpuq-Signature"] == f"sha256={expected}" and headers["X-Gpuq-Delivery"] == delivery.id
    session.refresh(delivery)
    assert (delivery.status, delivery.attempts) == ("delivered", 2) and delivery.delivered_at


def test_a_receiver_that_never_answers_is_given_up_on_after_the_last_attempt(session):
    job_id = finish_job(session, "http://127.0.0.1:9/unreachable")  # discard port: connection refused
    now = utcnow()
    for attempt in range(MAX_ATTEMPTS):
        now += timedelta(seconds=backoff_s(attempt) + 1)
        deliver_due(session, SECRET, policy=LOOPBACK, now=now)
    [delivery] = store.list_deliveries(session, job_id=job_id, batch_id=None, limit=10)
    assert (delivery.status, delivery.attempts) == ("failed", MAX_ATTEMPTS)
    assert delivery.last_error.startswith("ConnectError")


def test_jobs_without_a_webhook_make_no_delivery(session):
    finish_job(session, None)
    assert session.query(WebhookDelivery).count() == 0


def test_the_secret_is_generated_once_and_kept(tmp_path):
    first = load_secret("", tmp_path)
    assert len(first) == 64 and load_secret("", tmp_path) == first
    assert load_secret("configured", tmp_path) == b"configured"
