"""The prefix cache with a real API and real worker processes (issue 41 items 2, 3 and 5): a
start pushed out of the worker's only slot comes back from host RAM, a worker restarted finds
it on disk, and each job says how many prompt tokens came from where. One tenant's start never
serves another tenant. /metrics, GET /v1/workers and the dashboard's card show the cache."""

from __future__ import annotations

import httpx

from gpuq.cli.client import GpuqClient
from tests.e2e.conftest import wait_until
from tests.e2e.prompt_families import family_job, run_to_success, tenant_key
from tests.metrics_parsing import samples, total


def test_starts_come_back_from_ram_and_disk_and_never_across_tenants(processes, tmp_path):
    processes.settings |= {
        "GPUQ_WORKER_SLOTS": "1",  # one slot: a second family's prompt pushes the first's start out
        "GPUQ_WORKER_PREFIX_CACHE_DIR": str(tmp_path / "prefix-cache"),
    }
    _api, url = processes.start_api()
    worker, _name = processes.start_worker()
    key_a = tenant_key(url, processes.admin_key, "tenant-a")[1]
    key_b = tenant_key(url, processes.admin_key, "tenant-b")[1]
    with GpuqClient(url, api_key=key_a) as a, GpuqClient(url, api_key=key_b) as b:
        first = run_to_success(a, family_job(0, seed=1))
        assert first["cached_tokens"] == 0
        # Tenant B sends tenant A's very prompt: nothing of A's is reused, not even in the slot.
        other = run_to_success(b, family_job(0, seed=1))
        assert other["cached_tokens"] == 0 and other["result"] == first["result"]
        # A's start left the slot (B's took it) and comes back from host RAM.
        again = run_to_success(a, family_job(0, question=13, seed=1))
        assert again["cached_tokens"] >= 100
        assert again["cached_ram_tokens"] == again["cached_tokens"] and again["cached_disk_tokens"] == 0

        admin = {"Authorization": f"Bearer {processes.admin_key}"}

        def published() -> dict | None:
            [w] = httpx.get(f"{url}/v1/workers", headers=admin, timeout=30).json()["data"]
            cache = w["prefix_cache"]
            return cache if cache and cache["hits_ram"] >= 1 else None

        wait_until(published, "the worker never published its prefix cache's figures", 30)
        cache = published()
        assert cache is not None and cache["ram_entries"] >= 1 and cache["ram_limit_bytes"] > 0
        assert cache["disk_enabled"] is True
        metrics = samples(httpx.get(f"{url}/metrics", headers=admin, timeout=30).text)
        assert total(metrics, "gpuq_prefix_cache_hits_total", tier="ram") >= 1
        assert total(metrics, "gpuq_prefix_cache_restored_tokens_total", tier="ram") >= 100

        # A restarted worker (its RAM gone) finds A's start on disk, saved as the last one stopped.
        worker.stop()
        assert worker.popen.returncode == 0, worker.tail()
        processes.start_worker()
        restored = run_to_success(a, family_job(0, question=14, seed=1))
        assert restored["cached_disk_tokens"] >= 100 and restored["cached_tokens"] == restored["cached_disk_tokens"]
        # ... and a tenant that never sent it gets nothing of it from there.
        with GpuqClient(url, api_key=tenant_key(url, processes.admin_key, "tenant-c")[1]) as c:
            assert run_to_success(c, family_job(0, question=14, seed=1))["cached_tokens"] == 0
