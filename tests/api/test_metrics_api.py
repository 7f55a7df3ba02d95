"""GET /metrics in-process: admin only, valid exposition, gauges read from Redis now and
counters rendered from Redis, so every API process (and a restarted one) shows the same."""

from datetime import timedelta

from fastapi.testclient import TestClient
from redis import Redis
from rq.worker import Worker
from sqlalchemy import update

from api.main import create_app
from gpuq import store
from gpuq.db.tables import Gpu, Job, utcnow
from gpuq.fleet import telemetry
from gpuq.fleet.gpus import GpuInfo, simulated_inventory, with_free_memory
from gpuq.local.redis_server import PrivateRedis
from gpuq.redis_keys import GPUS_FIELD, HOST_FIELD, SLOT_FIELD, SLOTS_BUSY_FIELD, SLOTS_FIELD, rq_worker_key
from gpuq.stats import metrics
from tests.api.conftest import bearer
from tests.inventory import record_gpus
from tests.metrics_parsing import samples, total, value

MODEL = "smollm2-135m"
GEN = {"kind": "generate", "model": MODEL, "prompt": "Hi", "max_tokens": 4}
MIB = 1 << 20
REAL = GpuInfo(0, "GPU-real-0", "NVIDIA H100", 81559, 60000, 87, 64, 412.5, "9.0")


def test_metrics_need_an_admin_key(settings, make_key):
    with TestClient(create_app(settings)) as anonymous:
        assert anonymous.get("/metrics").status_code == 401
        assert anonymous.get("/metrics", headers=bearer(make_key("submitter"))).status_code == 403
        ok = anonymous.get("/metrics", headers=bearer(make_key("admin", "ops")))
    assert ok.status_code == 200
    assert ok.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert samples(ok.text)  # parses


def test_queue_depth_is_what_waits_now_by_model_kind_and_priority(client):
    for _ in range(3):
        assert client.post("/v1/jobs", json=GEN).status_code == 202
    embed = {"kind": "embed", "model": MODEL, "input": "x", "priority": "high"}
    assert client.post("/v1/jobs", json=embed).status_code == 202
    parsed = samples(client.get("/metrics").text)
    assert value(parsed, "gpuq_queue_depth", model=MODEL, kind="generate", priority="normal") == 3
    assert value(parsed, "gpuq_queue_depth", model=MODEL, kind="embed", priority="high") == 1
    assert value(parsed, "gpuq_queue_depth", model=MODEL, kind="generate", priority="low") == 0  # shown as 0
    assert total(parsed, "gpuq_queue_depth") == 4
    [job] = client.get("/v1/jobs", params={"kind": "embed"}).json()["data"]
    assert client.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200
    parsed = samples(client.get("/metrics").text)
    assert value(parsed, "gpuq_queue_depth", model=MODEL, kind="embed", priority="high") == 0
    assert value(parsed, "gpuq_jobs_total", model=MODEL, kind="embed", status="cancelled") == 1
    labels = {v for (_name, ls) in parsed for _k, v in ls}
    assert not any(v.startswith("job_") for v in labels)  # no job ids in labels


def test_gpu_gauges_show_what_each_gpu_reports_and_nothing_invented(client, session, redis_url):
    simulated = simulated_inventory("node1", [24]).gpus[0]
    store.upsert_gpus(
        session,
        [
            Gpu(uuid=g.uuid, host="node1", index=g.index, name=g.name, memory_total_mib=g.memory_total_mib, simulated=s)
            for g, s in ((simulated, True), (REAL, False))
        ],
    )
    session.commit()
    redis = Redis.from_url(redis_url)
    telemetry.publish(redis, [with_free_memory(simulated, 512), REAL])
    parsed = samples(client.get("/metrics").text)
    sim = {"gpu": simulated.uuid, "host": "node1", "name": simulated.name}
    assert value(parsed, "gpuq_gpu_memory_total_bytes", **sim) == 24 * 1024 * MIB
    assert value(parsed, "gpuq_gpu_memory_used_bytes", **sim) == 512 * MIB
    for name in ("gpuq_gpu_utilization_ratio", "gpuq_gpu_temperature_celsius", "gpuq_gpu_power_watts"):
        assert value(parsed, name, **sim) is None  # a simulated GPU has no such readings
    real = {"gpu": REAL.uuid, "host": "node1", "name": REAL.name}
    assert value(parsed, "gpuq_gpu_utilization_ratio", **real) == 0.87
    assert value(parsed, "gpuq_gpu_temperature_celsius", **real) == 64
    assert value(parsed, "gpuq_gpu_power_watts", **real) == 412.5
    assert value(parsed, "gpuq_gpu_memory_used_bytes", **real) == (81559 - 60000) * MIB
    redis.delete(*redis.keys("gpuq:gpu:*"))  # the supervisor went quiet: its readings expired
    parsed = samples(client.get("/metrics").text)
    assert total(parsed, "gpuq_gpu_memory_total_bytes") == 0
    redis.close()


def test_counters_are_the_same_from_every_api_process_and_after_a_restart(settings, admin_key, redis_url):
    redis = Redis.from_url(redis_url)
    metrics.record_finished_jobs(
        redis,
        [
            metrics.FinishedJob(MODEL, "generate", "succeeded", queue_wait_s=0.2, run_s=1.5, completion_tokens=40),
            metrics.FinishedJob(MODEL, "generate", "succeeded", queue_wait_s=30, run_s=0.3, completion_tokens=2),
            metrics.FinishedJob(MODEL, "generate", "failed", queue_wait_s=0.01, run_s=0.0),
        ],
    )
    metrics.record_model_load(redis, MODEL, 0.7)
    redis.close()
    scrapes = []
    for _process in range(2):
        with TestClient(create_app(settings), headers=bearer(admin_key)) as client:
            scrapes.append(samples(client.get("/metrics").text))
    assert scrapes[0] == scrapes[1]
    parsed = scrapes[0]
    assert value(parsed, "gpuq_jobs_total", model=MODEL, kind="generate", status="succeeded") == 2
    assert value(parsed, "gpuq_jobs_total", model=MODEL, kind="generate", status="failed") == 1
    assert value(parsed, "gpuq_tokens_generated_total", model=MODEL) == 42
    series = {"model": MODEL, "kind": "generate"}
    assert value(parsed, "gpuq_job_run_seconds_bucket", **series, le="0.25") == 1  # cumulative buckets
    assert value(parsed, "gpuq_job_run_seconds_bucket", **series, le="0.5") == 2
    assert value(parsed, "gpuq_job_run_seconds_bucket", **series, le="+Inf") == 3
    assert value(parsed, "gpuq_job_run_seconds_sum", **series) == 1.8
    assert value(parsed, "gpuq_job_queue_wait_seconds_bucket", **series, le="1.0") == 2
    assert value(parsed, "gpuq_job_queue_wait_seconds_count", **series) == 3
    assert value(parsed, "gpuq_model_loads_total", model=MODEL) == 1
    assert value(parsed, "gpuq_model_load_seconds_bucket", model=MODEL, le="1.0") == 1


def test_worker_slots_are_summed_per_host_and_slot_with_no_worker_names(client, redis_url):
    redis = Redis.from_url(redis_url)
    workers = {  # name: (state, slot, GPUs, slots, slots busy); two in gpu0 while one restarts
        "node1.gpu0.11.ab": ("busy", "gpu0", "GPU-0", 4, 3),
        "node1.gpu0.12.cd": ("idle", "gpu0", "GPU-0", 4, 0),
        "node1.group0+1.13.ef": ("busy", "group0+1", "GPU-0,GPU-1", 2, 1),
        "node2.cpu.14.aa": ("idle", "cpu", "", 1, 0),
    }
    for name, (state, slot, gpus, slots, busy) in workers.items():
        fields = {"state": state, HOST_FIELD: name.split(".")[0], SLOT_FIELD: slot, GPUS_FIELD: gpus}
        redis.hset(rq_worker_key(name), mapping=fields | {SLOTS_FIELD: slots, SLOTS_BUSY_FIELD: busy})
        redis.sadd(Worker.redis_workers_keys, rq_worker_key(name))
    parsed = samples(client.get("/metrics").text)
    gpu0 = {"host": "node1", "slot": "gpu0", "gpu": "GPU-0"}
    assert (value(parsed, "gpuq_worker_slots", **gpu0), value(parsed, "gpuq_worker_slots_busy", **gpu0)) == (8, 3)
    group = {"host": "node1", "slot": "group0+1", "gpu": "GPU-0,GPU-1"}
    assert (value(parsed, "gpuq_worker_slots", **group), value(parsed, "gpuq_worker_slots_busy", **group)) == (2, 1)
    cpu = {"host": "node2", "slot": "cpu", "gpu": ""}
    assert (value(parsed, "gpuq_worker_slots", **cpu), value(parsed, "gpuq_worker_slots_busy", **cpu)) == (1, 0)
    assert total(parsed, "gpuq_worker_slots_busy", host="node1") == 4
    assert value(parsed, "gpuq_workers", host="node1", state="busy") == 2  # the count by state is kept
    labels = {v for (_name, ls) in parsed for _k, v in ls}
    assert not labels & set(workers)  # no worker names (they carry a pid)

    redis.hset(rq_worker_key("node1.gpu0.11.ab"), "death", "2024-01-01T00:00:00Z")  # it died: not counted
    parsed = samples(client.get("/metrics").text)
    assert (value(parsed, "gpuq_worker_slots", **gpu0), value(parsed, "gpuq_worker_slots_busy", **gpu0)) == (4, 0)
    redis.close()


def test_each_queue_shows_how_long_its_oldest_job_has_waited(client, session):
    first = client.post("/v1/jobs", json=GEN).json()["id"]
    assert client.post("/v1/jobs", json=GEN).status_code == 202
    # The age comes from the front job's submission time in SQL: make it 20 minutes old.
    session.execute(update(Job).where(Job.id == first).values(created_at=utcnow() - timedelta(minutes=20)))
    session.commit()
    parsed = samples(client.get("/metrics").text)
    queue = {"model": MODEL, "kind": "generate"}
    assert 1200 <= value(parsed, "gpuq_queue_oldest_job_age_seconds", **queue, priority="normal") < 1260
    assert value(parsed, "gpuq_queue_oldest_job_age_seconds", **queue, priority="high") == 0  # empty
    assert client.post(f"/v1/jobs/{first}/cancel").status_code == 200  # the next one is seconds old
    parsed = samples(client.get("/metrics").text)
    assert value(parsed, "gpuq_queue_oldest_job_age_seconds", **queue, priority="normal") < 60


def test_gpu_health_and_liveness_cover_the_whole_inventory(client, session, redis_url):
    quiet, sick = simulated_inventory("node1", [24, 24]).gpus
    record_gpus(session, "node1", [quiet, sick])
    store.set_gpu_health(session, sick.uuid, healthy=False, reason="3 CUDA errors in a row")
    redis = Redis.from_url(redis_url)
    telemetry.publish(redis, [sick])  # only the sick GPU's supervisor is publishing
    redis.close()
    parsed = samples(client.get("/metrics").text)
    labels = {g.uuid: {"gpu": g.uuid, "host": "node1", "name": g.name} for g in (quiet, sick)}
    assert value(parsed, "gpuq_gpu_healthy", **labels[quiet.uuid]) == 1
    assert value(parsed, "gpuq_gpu_healthy", **labels[sick.uuid]) == 0
    assert value(parsed, "gpuq_gpu_live", **labels[quiet.uuid]) == 0
    assert value(parsed, "gpuq_gpu_live", **labels[sick.uuid]) == 1
    assert value(parsed, "gpuq_redis_up") == 1


def test_with_redis_down_a_scrape_still_answers_and_says_so(settings, admin_key, session, tmp_path):
    private = PrivateRedis(tmp_path / "redis", persist=False)
    app = create_app(settings.model_copy(update={"redis_url": private.start()}))
    gpu = simulated_inventory("node1", [24]).gpus[0]
    record_gpus(session, "node1", [gpu])
    with TestClient(app, headers=bearer(admin_key)) as client:
        assert client.post("/v1/jobs", json=GEN).status_code == 202
        up = samples(client.get("/metrics").text)
        private.stop()
        down = client.get("/metrics")
    assert value(up, "gpuq_redis_up") == 1 and total(up, "gpuq_queue_depth") == 1
    assert down.status_code == 200
    parsed = samples(down.text)
    assert value(parsed, "gpuq_redis_up") == 0
    assert value(parsed, "gpuq_gpu_healthy", gpu=gpu.uuid, host="node1", name=gpu.name) == 1  # from SQL
    # What lives in Redis is unknown now, and not shown as zeros; the queued jobs' tokens are
    # SQL's, and known.
    assert {name for name, _labels in parsed} == {
        "gpuq_redis_up",
        "gpuq_gpu_healthy",
        "gpuq_queued_prompt_tokens",
        "gpuq_queued_completion_tokens",
        "gpuq_queued_jobs_past_deadline",
    }
    assert value(parsed, "gpuq_queued_prompt_tokens", model=MODEL) > 0  # counted at submission
    assert value(parsed, "gpuq_queued_completion_tokens", model=MODEL) == 4  # its max_tokens
