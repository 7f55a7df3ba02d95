"""GET /v1/events: worker and GPU events recorded where they happen (drains in the API, GPU
marks by workers and supervisors, clears by admins), filtered and paged; restarts per slot
on /v1/workers."""

from datetime import UTC, datetime, timedelta

from rq.worker import Worker

from gpuq import store
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import EventKind, Gpu
from gpuq.fleet import health
from gpuq.redis_keys import GPUS_FIELD, HOST_FIELD, SLOT_FIELD, rq_worker_key
from tests.api.conftest import bearer
from tests.conftest import both_databases

WORKER = "node1.gpu0.4242.ab12"


def _register_worker(redis, name, **fields):
    """A live worker as RQ and gpuq's worker leave it in Redis: its hash and its registry entry."""
    redis.hset(rq_worker_key(name), mapping={"state": "idle", HOST_FIELD: "node1"} | fields)
    redis.sadd(Worker.redis_workers_keys, rq_worker_key(name))


def _gpu(session, uuid, index):
    store.upsert_gpus(
        session, [Gpu(uuid=uuid, host="node1", index=index, name="H100", memory_total_mib=81559, simulated=False)]
    )


def _events(client, **params):
    response = client.get("/v1/events", params=params)
    assert response.status_code == 200, response.text
    return response.json()


@both_databases
def test_drains_gpu_marks_and_clears_are_events_newest_first_and_filterable(client, redis, session, database_url):
    _gpu(session, "GPU-0", 0)
    _gpu(session, "GPU-1", 1)
    _register_worker(redis, WORKER, **{SLOT_FIELD: "gpu0", GPUS_FIELD: "GPU-0"})
    assert client.post(f"/v1/workers/{WORKER}/drain").status_code == 200
    assert client.post(f"/v1/workers/{WORKER}/undrain").status_code == 200
    assert client.post("/v1/hosts/node1/drain").status_code == 200
    assert client.post("/v1/hosts/node1/drain").status_code == 200  # already drained: no second event
    engine = sync_engine(database_url)
    health.mark_unhealthy(sync_sessions(engine), ["GPU-1"], "3 CUDA errors in a row")  # as a worker does
    engine.dispose()
    assert client.post("/v1/gpus/GPU-1/clear").status_code == 200

    events = _events(client)["data"]
    assert [e["kind"] for e in events] == ["gpu_cleared", "gpu_unhealthy", "drained", "undrained", "drained"]
    cleared, unhealthy, host_drain, _undrain, drain = events
    assert (unhealthy["host"], unhealthy["gpu_uuids"], unhealthy["detail"]) == (
        "node1",
        ["GPU-1"],
        "3 CUDA errors in a row",
    )
    assert cleared["detail"] == "cleared by an admin"
    assert (drain["host"], drain["slot"], drain["worker"], drain["gpu_uuids"]) == (
        "node1",
        "gpu0",
        "node1.gpu0.4242",
        ["GPU-0"],
    )
    assert drain["detail"].startswith("by admin key ")
    assert (host_drain["slot"], host_drain["worker"]) == (None, None)
    assert host_drain["detail"].endswith(", host-wide")

    assert [e["kind"] for e in _events(client, worker=WORKER)["data"]] == ["undrained", "drained"]
    assert [e["kind"] for e in _events(client, worker="node1.gpu0.4242")["data"]] == ["undrained", "drained"]
    assert [e["kind"] for e in _events(client, gpu="GPU-1")["data"]] == ["gpu_cleared", "gpu_unhealthy"]
    assert [e["kind"] for e in _events(client, gpu="GPU-")["data"]] == []  # a whole UUID, not a part
    assert len(_events(client, kind=["drained", "undrained"])["data"]) == 3
    assert _events(client, host="node2")["data"] == []
    future = (datetime.now(UTC) + timedelta(minutes=1)).isoformat()
    assert _events(client, since=future)["data"] == []
    assert len(_events(client, until=future)["data"]) == 5


@both_databases
def test_events_are_paged_and_bad_filters_are_a_422_that_says_what_to_fix(client, session, make_key):
    store.record_events(session, [store.NewEvent(EventKind.STARTED, host="node1", slot=f"gpu{i}") for i in range(5)])
    first = _events(client, limit=2)
    assert first["has_more"] and len(first["data"]) == 2
    second = _events(client, limit=2, after=first["next_after"])
    third = _events(client, limit=2, after=second["next_after"])
    assert (third["has_more"], third["next_after"]) == (False, None)
    slots = [e["slot"] for page in (first, second, third) for e in page["data"]]
    assert slots == ["gpu4", "gpu3", "gpu2", "gpu1", "gpu0"]

    for params, says in (
        ({"after": 999999}, "event 999999, which does not exist"),
        ({"since": "2026-01-31T12:00:00"}, "need a time zone"),
        ({"kind": "exploded"}, "kind"),
        ({"limit": 0}, "limit"),
    ):
        response = client.get("/v1/events", params=params)
        assert response.status_code == 422, params
        assert says in response.text, response.text
    submitter = make_key(role="submitter")
    assert client.get("/v1/events", headers=bearer(submitter)).status_code == 403


@both_databases
def test_workers_show_how_often_their_slot_was_restarted(client, redis, session):
    _register_worker(redis, WORKER, **{SLOT_FIELD: "gpu0", GPUS_FIELD: "GPU-0"})
    _register_worker(redis, "node1.gpu1.4243.cd34", **{SLOT_FIELD: "gpu1", GPUS_FIELD: "GPU-1"})
    restarted = store.NewEvent(EventKind.RESTARTED, host="node1", slot="gpu0")
    elsewhere = store.NewEvent(EventKind.RESTARTED, host="node2", slot="gpu0")  # another host's gpu0
    store.record_events(session, [restarted, restarted, elsewhere])
    views = {w["name"]: w["restarts"] for w in client.get("/v1/workers").json()["data"]}
    assert views == {WORKER: 2, "node1.gpu1.4243.cd34": 0}
    assert client.get(f"/v1/workers/{WORKER}").json()["restarts"] == 2
