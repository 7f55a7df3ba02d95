"""Several GPU hosts on one Redis and one PostgreSQL, proven on one machine: two supervisors
with their own host labels and simulated GPU inventories (host-a: 24 and 24 GiB, host-b:
48 GiB), one API and one scheduler, all real processes. Every job's end state is read
from SQL, the system of record."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from redis import Redis
from rq.worker import Worker
from sqlalchemy import select

from gpuq.cli.client import GpuqClient
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import Job
from gpuq.queue_names import Priority, queue_name
from gpuq.redis_keys import rq_queue_key
from gpuq.testing import GpuqProcesses, Process

MODEL = "smollm2-135m"
HOSTS = {"host-a": "24,24", "host-b": "48"}  # three workers in all, one per simulated GPU
FAST = {
    "GPUQ_WORKER_THREADS": "1",
    "GPUQ_WORKER_TTL_S": "3",
    "GPUQ_WORKER_HEARTBEAT_INTERVAL_S": "0.5",
    "GPUQ_WORKER_REFRESH_INTERVAL_S": "1",
    "GPUQ_RECONCILE_INTERVAL_S": "1",
    "GPUQ_RECONCILE_GRACE_S": "1",
}
RULES_PICKED_UP_S = 2.5  # workers re-read rules every second here
# Long enough to be caught running (tens of tokens/s per worker on this host), short enough to finish.
LONG = {"kind": "generate", "model": MODEL, "prompt": "Count from 1 to 1000: 1, 2, 3,", "temperature": 0}

# One PostgreSQL, as a multi-host deployment has: `processes` is built on this database.
pytestmark = pytest.mark.parametrize("empty_database_url", ["postgresql"], indirect=True)


@dataclass
class Fleet:
    processes: GpuqProcesses
    client: GpuqClient
    url: str
    supervisors: dict[str, Process]

    def rows(self, ids: list[str]) -> dict[str, Job]:
        engine = sync_engine(self.processes.database_url)
        try:
            with sync_sessions(engine)() as session:
                return {j.id: j for j in session.scalars(select(Job).where(Job.id.in_(ids)))}
        finally:
            engine.dispose()

    def running_on(self, host: str) -> list[str]:
        return [j for w in self.client.workers()["data"] if w["host"] == host for j in w["running_jobs"]]

    def worker_pids(self, host: str) -> list[int]:
        names = {w["name"] for w in self.client.workers()["data"] if w["host"] == host}
        redis = Redis.from_url(self.processes.redis_url)
        try:
            return [w.pid for w in Worker.all(connection=redis) if w.name in names and w.pid]
        finally:
            redis.close()


@pytest.fixture
def fleet(processes) -> Iterator[Fleet]:
    processes.settings |= FAST
    _api, url = processes.start_api()
    processes.start_scheduler()
    supervisors, workers = {}, 0
    for host, sizes in HOSTS.items():
        workers += len(sizes.split(","))
        supervisors[host], _ = processes.start_supervisor(
            expected_workers=workers, settings={"GPUQ_HOST_LABEL": host, "GPUQ_SIMULATED_GPUS": sizes}
        )
    with processes.client(url) as client:
        yield Fleet(processes, client, url, supervisors)


def gpus_command(fleet: Fleet) -> str:
    """`gpuq gpus` as an admin runs it on any machine that reaches the API."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    env |= {"GPUQ_API_KEY": fleet.processes.admin_key, "GPUQ_DATA_DIR": str(fleet.processes.workdir)}
    done = subprocess.run(
        [sys.executable, "-m", "gpuq.cli", "gpus", "--url", fleet.url], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def wait_until(condition, timeout_s: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found := condition():
            return found
        time.sleep(0.05)
    raise TimeoutError(f"{what} not met in {timeout_s:.0f} s")


def test_jobs_flow_to_both_hosts_and_a_rule_selecting_one_host_is_honoured(fleet):
    listing = gpus_command(fleet).splitlines()  # the whole fleet, from the API, not this machine's (no) GPUs
    gpus = fleet.client.gpus()
    assert sorted((g["host"], g["index"], g["memory_total_mib"]) for g in gpus) == [
        ("host-a", 0, 24576),
        ("host-a", 1, 24576),
        ("host-b", 0, 49152),
    ]
    for gpu in gpus:  # one row each: host, index, UUID, name, memory, ..., state
        row = re.split(r"\s{2,}", next(line for line in listing if gpu["uuid"] in line))
        memory = f"{gpu['memory_total_mib']} MiB"
        assert row == [gpu["host"], str(gpu["index"]), gpu["uuid"], gpu["name"], memory, memory, "live"]
    assert listing[-1] == "3 GPU(s) on 2 host(s); 0 silent, 0 unhealthy"

    everywhere = [j["id"] for j in fleet.client.submit_many([LONG | {"max_tokens": 8, "seed": i} for i in range(12)])]
    for job_id in everywhere:
        fleet.client.wait(job_id, timeout_s=180)
    rows = fleet.rows(everywhere)
    assert {r.status for r in rows.values()} == {"succeeded"}
    assert {r.host for r in rows.values()} == {"host-a", "host-b"}, "both hosts should have taken jobs"
    assert all(r.device.startswith("simulated:GPU-SIM-") and r.completion_tokens == 8 for r in rows.values())

    fleet.client.add_rule({"model_pattern": MODEL, "kind": "embed", "effect": "allow", "host_pattern": "host-b"})
    time.sleep(RULES_PICKED_UP_S)
    confined = [
        j["id"]
        for j in fleet.client.submit_many([{"kind": "embed", "model": MODEL, "input": f"text {i}"} for i in range(8)])
    ]
    for job_id in confined:
        fleet.client.wait(job_id, timeout_s=180)
    rows = fleet.rows(confined)
    assert {(r.status, r.host) for r in rows.values()} == {("succeeded", "host-b")}
    assert {r.gpu_uuid for r in rows.values()} == {g["uuid"] for g in gpus if g["host"] == "host-b"}


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_a_host_that_stops_hands_its_work_to_the_other_with_nothing_lost(fleet, how):
    """SIGTERM: host-a drains (its running jobs finish there) and host-b takes the queue.
    SIGKILL of the supervisor and its workers (the host is lost): the scheduler's reconciler
    finds the dead workers once their TTL runs out and their jobs run again on host-b."""
    ids = [j["id"] for j in fleet.client.submit_many([LONG | {"max_tokens": 48, "seed": i} for i in range(12)])]
    caught = wait_until(lambda: fleet.running_on("host-a"), what="a job running on host-a")
    supervisor = fleet.supervisors["host-a"]
    stopped_at = time.time()
    if how == "sigterm":
        supervisor.stop(timeout_s=120)
        assert supervisor.popen.returncode == 0, supervisor.tail()
    else:
        victims = fleet.worker_pids("host-a")
        assert victims
        supervisor.kill()
        for pid in victims:
            os.kill(pid, signal.SIGKILL)

    for job_id in ids:
        fleet.client.wait(job_id, timeout_s=240)
    rows = fleet.rows(ids)
    assert len(rows) == len(ids)
    assert {r.status for r in rows.values()} == {"succeeded"}, {r.id: (r.status, r.error) for r in rows.values()}
    assert all(r.completion_tokens == 48 and r.result for r in rows.values())
    # Host-a started nothing once told to stop; what it ran then, it finished (SIGTERM) or
    # host-b ran again (SIGKILL).
    assert not [r.id for r in rows.values() if r.host == "host-a" and r.started_at.timestamp() > stopped_at]
    expected_host = "host-a" if how == "sigterm" else "host-b"
    assert {rows[j].host for j in caught} == {expected_host}
    assert any(r.host == "host-b" for r in rows.values())
    redis = Redis.from_url(fleet.processes.redis_url)
    try:  # and nothing is left waiting in Redis
        assert sum(redis.llen(rq_queue_key(queue_name(MODEL, "generate", p, "admin"))) for p in Priority) == 0
    finally:
        redis.close()
