"""Webhooks cannot reach inside: an internal destination is refused when it is submitted and
again before each delivery (DNS rebinding), before any connection is made; receivers an
admin allows are reached at the address checked; submitters read a status and an error
class, never the receiver's answer; credentials in URLs are never shown.

Nothing here leaves the machine: webhook hosts resolve through a stub, the "internal
service" is an HTTP server on loopback, and ``guarded_network`` records (and refuses
anything off loopback) every connection and DNS lookup the process attempts."""

import base64
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from gpuq import store
from gpuq.batches.destinations import DestinationPolicy
from gpuq.batches.webhooks import deliver_due
from gpuq.db.tables import Job, JobStatus, WebhookDelivery, utcnow
from gpuq.store.webhooks import new_delivery
from tests.api.conftest import bearer
from tests.api.test_batches_api import line, upload
from tests.conftest import both_databases
from tests.network_guard import PUBLIC_ADDRESS, guarded_network

MODEL = "smollm2-135m"
SECRET = b"test-secret"


class InternalService:
    """An HTTP server on loopback standing for what lives inside: it records every request."""

    def __init__(self, status: int = 200, body: bytes = b"") -> None:
        self.requests: list[dict[str, str]] = []
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                service.requests.append(dict(self.headers))
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                """Quiet."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_port
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def internal():
    made: list[InternalService] = []

    def make(status: int = 200, body: bytes = b"") -> InternalService:
        made.append(InternalService(status, body))
        return made[-1]

    yield make
    for service in made:
        service.close()


@pytest.fixture
def network(monkeypatch):
    with guarded_network(monkeypatch) as guarded:
        yield guarded
    assert guarded.lookups == []  # every host name went through the stub resolver


def noop_job(webhook_url: str) -> dict:
    return {"kind": "noop", "model": MODEL, "webhook_url": webhook_url}


def finish(session, job_id: str) -> None:
    """The job ends as a worker would end it: its delivery row is written with the outcome."""
    job = session.get(Job, job_id)
    store.claim_job(session, job_id, worker="w", device="cpu")
    outcome = store.Outcome(
        job_id, "w", JobStatus.SUCCEEDED, utcnow(), webhook_url=job.request["webhook_url"], owner=job.owner
    )
    store.record_outcomes(session, [outcome])


INTERNAL_URLS = [
    "http://127.0.0.1:{port}/hook",
    "http://localhost:{port}/hook",
    "http://[::1]:{port}/",
    "http://[::ffff:127.0.0.1]:{port}/",
    "http://2130706433:{port}/",
    "http://internal.example:{port}/hook",
    "http://10.0.0.5/hook",
    "http://169.254.169.254/latest/meta-data/",
    "http://[fd00::1]/",
    "http://0.0.0.0:{port}/",
]


@both_databases
@pytest.mark.parametrize("template", INTERNAL_URLS)
def test_an_internal_webhook_url_is_refused_at_submission_before_any_connection(
    client, resolver, internal, network, job_rows, session, template
):
    service = internal()
    resolver.answers |= {"localhost": ["127.0.0.1"], "internal.example": ["127.0.0.1"]}
    url = template.format(port=service.port)
    job = client.post("/v1/jobs", json=noop_job(url))
    assert job.status_code == 422, job.text
    assert job.json()["error"]["param"] == "webhook_url" and "public addresses only" in job.json()["detail"]
    bulk = client.post("/v1/jobs/bulk", json={"jobs": [noop_job("https://hooks.example/"), noop_job(url)]})
    assert bulk.status_code == 422
    file_id = upload(client, line("a")).json()["id"]
    batch = client.post(
        "/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/embeddings", "webhook_url": url}
    )
    assert batch.status_code == 422 and "public addresses only" in batch.json()["detail"]
    assert job_rows() == [] and session.query(WebhookDelivery).count() == 0
    assert service.requests == [] and network.connections_to(service.port) == []


def test_a_public_webhook_url_is_accepted_without_connecting_to_it(client, network):
    response = client.post("/v1/jobs", json=noop_job("https://hooks.example/hook"))
    assert response.status_code == 202, response.text
    assert all(host != PUBLIC_ADDRESS for host, _port in network.connections)


@both_databases
def test_a_host_that_rebinds_to_loopback_after_submission_is_refused_at_delivery(
    client, resolver, internal, network, session, caplog
):
    service = internal()
    resolver.answers["rebind.example"] = [PUBLIC_ADDRESS]  # public when submitted...
    url = f"http://user:pa55word@rebind.example:{service.port}/hook"
    job = client.post("/v1/jobs", json=noop_job(url)).json()
    finish(session, job["id"])
    resolver.answers["rebind.example"] = ["127.0.0.1"]  # ... loopback when it is sent
    policy = DestinationPolicy.from_setting("", resolve=resolver)
    assert deliver_due(session, SECRET, policy=policy) == []
    [delivery] = client.get("/v1/webhooks/deliveries", params={"job_id": job["id"]}).json()["data"]
    assert delivery["status"] == "failed" and delivery["last_status_code"] is None
    assert delivery["last_error"].startswith("destination refused: its host resolves to a loopback address")
    assert service.requests == [] and network.connections_to(service.port) == []
    assert "pa55word" not in caplog.text and "***@rebind.example" in caplog.text


@both_databases
def test_a_stored_delivery_to_the_api_itself_is_refused_when_it_is_due(client, session, network, internal):
    """Rows queued before destinations were checked, or by an admin's later change of the setting."""
    service = internal()
    session.add(new_delivery("job.succeeded", f"http://127.0.0.1:{service.port}/v1/keys", {}, job_id="job_x"))
    session.commit()
    assert deliver_due(session, SECRET, policy=DestinationPolicy.from_setting("")) == []
    [row] = session.query(WebhookDelivery).all()
    assert row.status == "failed" and "a loopback address" in row.last_error
    assert service.requests == [] and network.connections_to(service.port) == []


@both_databases
def test_an_allowed_internal_host_is_reached_at_the_address_checked_with_its_credentials(
    settings, make_key, resolver, internal, network, session
):
    service = internal()
    resolver.answers["hooks.internal"] = ["127.0.0.1"]
    allowed = settings.model_copy(update={"webhook_allowed_hosts": "hooks.internal"})
    url = f"http://alice:s3cret@hooks.internal:{service.port}/hook"
    with TestClient(create_app(allowed, resolve=resolver), headers=bearer(make_key("submitter", "acme"))) as c:
        job = c.post("/v1/jobs", json=noop_job(url)).json()
        assert job["request"]["webhook_url"] == f"http://***@hooks.internal:{service.port}/hook"
        finish(session, job["id"])
        policy = DestinationPolicy.from_setting(allowed.webhook_allowed_hosts, resolve=resolver)
        [delivered] = deliver_due(session, SECRET, policy=policy)
        [delivery] = c.get("/v1/webhooks/deliveries", params={"job_id": job["id"]}).json()["data"]
    assert delivery["id"] == delivered and delivery["status"] == "delivered"
    assert delivery["url"] == f"http://***@hooks.internal:{service.port}/hook"
    [request] = service.requests
    assert request["Host"] == f"hooks.internal:{service.port}"  # sent as the host name, to the address checked
    assert request["Authorization"] == "Basic " + base64.b64encode(b"alice:s3cret").decode()
    assert network.connections_to(service.port) == [("127.0.0.1", service.port)]


@both_databases
def test_a_submitter_reads_the_status_and_error_class_never_the_receivers_answer(
    settings, make_key, resolver, internal, network, session
):
    service = internal(status=500, body=b"redis_version:7.2 internal secret")
    resolver.answers["hooks.internal"] = ["127.0.0.1"]
    allowed = settings.model_copy(update={"webhook_allowed_hosts": "hooks.internal"})
    with TestClient(create_app(allowed, resolve=resolver), headers=bearer(make_key("submitter", "acme"))) as c:
        job = c.post("/v1/jobs", json=noop_job(f"http://hooks.internal:{service.port}/")).json()
        finish(session, job["id"])
        deliver_due(session, SECRET, policy=DestinationPolicy.from_setting("hooks.internal", resolve=resolver))
        response = c.get("/v1/webhooks/deliveries", params={"job_id": job["id"]})
    [delivery] = response.json()["data"]
    assert (delivery["status"], delivery["last_status_code"], delivery["last_error"]) == ("pending", 500, "HTTP 500")
    assert "internal secret" not in response.text and len(service.requests) == 1
    row = session.query(WebhookDelivery).one()
    assert "internal secret" not in (row.last_error or "")  # not kept at all


def test_deliveries_logged_before_the_fix_show_only_their_error_class(client, session):
    old = new_delivery("job.failed", "http://hooks.example/", {}, job_id="job_old")
    old.last_error = "HTTP 500: <html>internal secret</html>"
    other = new_delivery("job.failed", "http://hooks.example/", {}, job_id="job_old")
    other.last_error = "ConnectError: [Errno 111] Connection refused"
    session.add_all([old, other])
    session.commit()
    shown = {d["last_error"] for d in client.get("/v1/webhooks/deliveries").json()["data"]}
    assert shown == {"HTTP 500", "ConnectError"}
