"""Prefix-aware placement with a real API, real workers and a real scheduler (issue 42 item 2):
a job whose start a worker holds runs on that worker and reuses it; the load guard sends the
family elsewhere when its holder is loaded; a tenant never reuses another's start; a worker
holding lane jobs killed outright, another drained mid-run, and a lane job cancelled: every
job ends once, the cancelled one never runs, the drained worker starts nothing after its drain;
a worker frozen with jobs in its lane (alive to Redis, taking nothing): the other worker steals
them once they have waited past the steal bound, with no reconciler to hand the lane back."""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime

import httpx
from redis import Redis
from rq.worker import Worker

from gpuq.cli.client import GpuqClient
from gpuq.redis_keys import prefix_index_key, rq_job_key
from tests.e2e.conftest import wait_until
from tests.e2e.prompt_families import family_job, run_to_success, tenant_key
from tests.metrics_parsing import samples, total

ROUTED = {
    "GPUQ_PREFIX_ROUTING": "on",
    "GPUQ_WORKER_SLOTS": "2",
    "GPUQ_WORKER_THREADS": "1",
    "GPUQ_WORKER_HEARTBEAT_INTERVAL_S": "0.5",
}


def test_a_job_goes_where_its_start_is_held_until_that_worker_is_loaded(processes):
    processes.settings |= ROUTED | {"GPUQ_PREFIX_ROUTING_STEAL_S": "60"}
    _api, url = processes.start_api()
    _a, name_a = processes.start_worker("a")
    _b, name_b = processes.start_worker("b")
    redis = Redis.from_url(processes.redis_url)
    with GpuqClient(url, api_key=tenant_key(url, processes.admin_key, "tenant-a")[1]) as a:
        first = run_to_success(a, family_job(0))
        holder = first["worker"]
        wait_until(lambda: redis.scard(prefix_index_key(holder)) >= 7, "the holder never published its start", 30)

        # The family's next jobs, one at a time: each on the holder, its start reused.
        for question in (13, 14, 15):
            done = run_to_success(a, family_job(0, question))
            assert done["worker"] == holder and done["cached_tokens"] >= 100, done

        # Another tenant's very prompt: its chain is salted by its own scope, nothing is reused.
        with GpuqClient(url, api_key=tenant_key(url, processes.admin_key, "tenant-b")[1]) as b:
            assert run_to_success(b, family_job(0, 13))["cached_tokens"] == 0

        # Many of the family at once: the holder takes them while its load stays within its slots
        # of the other's; past that the load guard sends them to the other worker.
        ids = [j["id"] for j in a.submit_many([family_job(0, 20 + q, max_tokens=24) for q in range(10)])]
        done = [a.wait(i, timeout_s=300) for i in ids]
    redis.close()
    assert all(j["status"] == "succeeded" for j in done), done
    workers = {j["worker"] for j in done}
    assert workers == {name_a, name_b}, workers
    assert sum(j["worker"] == holder for j in done) >= 3


def test_killed_drained_and_cancelled_lanes_end_every_job_once(processes):
    processes.settings |= ROUTED | {
        "GPUQ_PREFIX_ROUTING_STEAL_S": "2",
        "GPUQ_WORKER_TTL_S": "3",
        "GPUQ_RECONCILE_INTERVAL_S": "1",
    }
    _api, url = processes.start_api()
    doomed, doomed_name = processes.start_worker("doomed")
    _drained, drained_name = processes.start_worker("drained")
    _survivor, survivor_name = processes.start_worker("survivor")
    processes.start_scheduler()
    redis = Redis.from_url(processes.redis_url)
    with processes.client(url) as client:
        jobs = [family_job(family, 20 + q, max_tokens=16) for q in range(4) for family in range(6)]
        ids = [j["id"] for j in client.submit_many(jobs)]
        origins = {i: (redis.hget(rq_job_key(i), "origin") or b"").decode() for i in ids}
        in_lanes = [i for i in ids if "@" in origins[i]]
        assert {origins[i].rsplit("@", 1)[1] for i in in_lanes} == {doomed_name, drained_name, survivor_name}
        cancelled = in_lanes[-1]  # the last placed: deep in its lane, not started yet
        assert client.cancel(cancelled)["status"] == "cancelled"

        wait_until(lambda: client.job(ids[0])["status"] != "queued", "nothing started", 120)
        wait_until(
            lambda: any(client.job(i)["worker"] == doomed_name for i in ids), "the doomed worker ran nothing", 120
        )
        doomed.kill()  # SIGKILL: its lane and running jobs are left behind
        client.drain(drained_name)
        drained_at = time.time()
        done = {i: client.wait(i, timeout_s=600) for i in ids}
    redis.close()

    assert done[cancelled]["status"] == "cancelled" and not done[cancelled]["runs"]
    for job_id, job in done.items():
        if job_id == cancelled:
            continue
        outcomes = [r["outcome"] for r in job["runs"]]
        assert job["status"] == "succeeded" and outcomes.count("succeeded") == 1, job
        for run in job["runs"]:  # the drained worker started nothing after its drain
            if run["worker"] == drained_name:  # (the drain reaches it within a second or so)
                assert _epoch(run["started_at"]) <= drained_at + 2.0, run
    # The killed worker's lane went to the others (stolen, or handed back by the reconciler).
    lost_lane = [i for i in in_lanes if origins[i].endswith("@" + doomed_name) and i != cancelled]
    assert any(done[i]["worker"] != doomed_name for i in lost_lane)


def test_a_frozen_workers_lane_is_stolen_by_an_idle_worker(processes):
    processes.settings |= ROUTED | {"GPUQ_PREFIX_ROUTING_STEAL_S": "2", "GPUQ_WORKER_TTL_S": "300"}
    _api, url = processes.start_api()
    frozen, frozen_name = processes.start_worker("frozen")
    redis = Redis.from_url(processes.redis_url)
    try:
        with processes.client(url) as client:
            assert run_to_success(client, family_job(0))["worker"] == frozen_name
            wait_until(lambda: redis.scard(prefix_index_key(frozen_name)) >= 7, "the start was never published", 30)
            _idle, idle_name = processes.start_worker("idle")
            os.kill(frozen.popen.pid, signal.SIGSTOP)  # alive to Redis for its 300 s TTL, taking nothing
            ids = [j["id"] for j in client.submit_many([family_job(0, 20 + q) for q in range(2)])]
            # Both go to the frozen worker's lane: it holds their start and its load (its lane)
            # stays within its 2 slots of the idle worker's.
            assert all(redis.hget(rq_job_key(i), "origin").decode().endswith("@" + frozen_name) for i in ids)
            done = [client.wait(i, timeout_s=120) for i in ids]
            still_registered = frozen_name in {w.name for w in Worker.all(connection=redis)}
        metrics = samples(
            httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {processes.admin_key}"}, timeout=30).text
        )
    finally:
        os.kill(frozen.popen.pid, signal.SIGCONT)
        redis.close()
    assert [j["status"] for j in done] == ["succeeded", "succeeded"], done
    assert {j["worker"] for j in done} == {idle_name}
    assert still_registered  # taken by stealing, not handed back as a dead worker's
    assert total(metrics, "gpuq_jobs_placed_total", how="stolen") == 2


def test_with_routing_off_no_job_enters_a_lane_and_no_worker_publishes_its_starts(processes):
    processes.settings |= ROUTED | {"GPUQ_PREFIX_ROUTING": "off"}
    _api, url = processes.start_api()
    _a, name_a = processes.start_worker("a")
    _b, name_b = processes.start_worker("b")
    redis = Redis.from_url(processes.redis_url)
    with processes.client(url) as client:
        first = run_to_success(client, family_job(0))
        ids = [j["id"] for j in client.submit_many([family_job(0, 20 + q) for q in range(4)])]
        origins = [(redis.hget(rq_job_key(i), "origin") or b"").decode() for i in ids]
        done = [client.wait(i, timeout_s=120) for i in ids]
    published = [redis.exists(prefix_index_key(name)) for name in (name_a, name_b)]
    redis.close()
    assert first["status"] == "succeeded"
    assert not any("@" in origin for origin in origins), origins  # every job in the shared queues
    assert [j["status"] for j in done] == ["succeeded"] * 4
    assert published == [0, 0]


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()
