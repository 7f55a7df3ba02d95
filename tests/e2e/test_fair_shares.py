"""Fair shares between tenants with a real API and a real worker process (issue 42 item 1):
tenant A's 96 jobs and tenant B's 4, queued together at one priority, are taken in turns, not
first in first out; a weight set through the keys API shares turns in its ratio; a higher
priority still goes first. The order is read from the runs' claims (``job_runs.id``)."""

from __future__ import annotations

import httpx
from sqlalchemy import select

from gpuq.cli.client import GpuqClient
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import JobRun
from tests.e2e.prompt_families import tenant_key

MODEL = "smollm2-135m"
NOOP = {"kind": "noop", "model": MODEL}


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _claim_order(database_url: str, ids: list[str]) -> list[str]:
    engine = sync_engine(database_url)
    try:
        with sync_sessions(engine)() as session:
            return list(session.scalars(select(JobRun.job_id).where(JobRun.job_id.in_(ids)).order_by(JobRun.id)))
    finally:
        engine.dispose()


def _run_all(processes, url: str, ids: list[str]) -> list[str]:
    """Starts a worker on what waits, and returns the jobs in the order it took them."""
    processes.start_worker()
    with processes.client(url) as client:
        assert {client.wait(i)["status"] for i in ids} == {"succeeded"}
    return _claim_order(processes.database_url, ids)


def test_a_tenant_queued_behind_another_tenants_batch_runs_in_turns_with_it(processes):
    _api, url = processes.start_api()
    _id_a, key_a = tenant_key(url, processes.admin_key, "tenant-a")
    _id_b, key_b = tenant_key(url, processes.admin_key, "tenant-b")
    with GpuqClient(url, api_key=key_a) as a, GpuqClient(url, api_key=key_b) as b:
        a_ids = [j["id"] for j in a.submit_many([NOOP] * 96)]
        b_ids = [j["id"] for j in b.submit_many([NOOP] * 4)]
    position = httpx.get(f"{url}/v1/jobs/{b_ids[-1]}/position", headers=_bearer(key_b), timeout=30).json()

    order = _run_all(processes, url, a_ids + b_ids)

    b_last = max(order.index(i) for i in b_ids)
    assert b_last == 7  # turn about: A, B, A, B, ... (A's name sorts first), not after A's 96
    assert position["position"] == b_last  # what the API said before any ran
    assert [i for i in order if i in a_ids] == a_ids  # each tenant's own jobs first in first out


def test_weights_set_through_the_keys_api_share_turns_and_priority_still_comes_first(processes):
    _api, url = processes.start_api()
    id_a, key_a = tenant_key(url, processes.admin_key, "tenant-a")
    _id_b, key_b = tenant_key(url, processes.admin_key, "tenant-b")
    changed = httpx.patch(f"{url}/v1/keys/{id_a}", json={"weight": 2}, headers=_bearer(processes.admin_key))
    assert changed.status_code == 200 and changed.json()["weight"] == 2
    with GpuqClient(url, api_key=key_a) as a, GpuqClient(url, api_key=key_b) as b:
        a_ids = [j["id"] for j in a.submit_many([NOOP] * 30)]
        b_ids = [j["id"] for j in b.submit_many([NOOP] * 30)]
        urgent = [j["id"] for j in b.submit_many([NOOP | {"priority": "high"}] * 3)]

    order = _run_all(processes, url, a_ids + b_ids + urgent)

    assert order[:3] == urgent  # a higher priority before any share
    first = order[3:33]
    assert sum(i in a_ids for i in first) == 20 and sum(i in b_ids for i in first) == 10  # 2:1
