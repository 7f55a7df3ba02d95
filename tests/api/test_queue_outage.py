"""When Redis is down, a submission fails clearly and leaves no row claiming to be queued."""

from fastapi.testclient import TestClient

from api.main import create_app
from gpuq.local.redis_server import PrivateRedis
from tests.api.conftest import bearer
from tests.conftest import both_databases


@both_databases
def test_a_submission_while_redis_is_down_is_a_503_and_leaves_no_row(settings, job_rows, tmp_path, admin_key):
    private = PrivateRedis(tmp_path / "redis", persist=False)
    url = private.start()
    app = create_app(settings.model_copy(update={"redis_url": url}))
    with TestClient(app, headers=bearer(admin_key)) as client:
        ok = client.post("/v1/jobs", json={"kind": "noop", "model": "smollm2-135m"})
        assert ok.status_code == 202
        private.stop()
        down = client.post("/v1/jobs", json={"kind": "noop", "model": "smollm2-135m"})
        assert down.status_code == 503
        assert down.json()["detail"].startswith("the job queue (Redis) is unavailable, nothing was queued")
        assert client.get("/readyz").status_code == 503
    assert [row.id for row in job_rows()] == [ok.json()["id"]]
