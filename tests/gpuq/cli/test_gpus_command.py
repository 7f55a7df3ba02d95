"""`gpuq gpus`: the whole fleet from the API (every host's inventory, live or silent,
healthy or not), or with --local this host's GPUs as its supervisor would discover them."""

from __future__ import annotations

import re

import pytest
from redis import Redis

from gpuq import store
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.fleet import telemetry
from gpuq.fleet.gpus import simulated_inventory, with_free_memory
from tests.gpuq.cli.conftest import Api, run
from tests.inventory import record_gpus


@pytest.fixture
def env(api: Api) -> dict[str, str | None]:
    return {"GPUQ_API_URL": api.url, "GPUQ_API_KEY": api.key, "GPUQ_DATA_DIR": str(api.data_dir)}


def columns(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def test_an_empty_fleet_says_so(env, tmp_path):
    done = run(["gpus"], env, tmp_path)
    assert done.exit_code == 0, done.output
    assert done.stdout == "no GPU in the fleet: no supervisor has recorded one (workers without GPUs run on the CPU)\n"


def test_every_hosts_gpus_with_their_state(api, env, tmp_path, redis_server_url, redis_dbs):
    a0, a1 = simulated_inventory("host-a", [24, 24]).gpus
    (b0,) = simulated_inventory("host-b", [80]).gpus
    engine = sync_engine(api.database_url)
    with sync_sessions(engine)() as session:
        record_gpus(session, "host-a", [a0, a1])
        record_gpus(session, "host-b", [b0])
        store.set_gpu_health(session, a1.uuid, healthy=False, reason="3 CUDA errors in a row")
    engine.dispose()
    redis = Redis.from_url(f"{redis_server_url}/{redis_dbs.main}")
    telemetry.publish(redis, [with_free_memory(a0, 1024), a1])  # host-b's supervisor is silent
    redis.close()

    done = run(["gpus"], env, tmp_path)
    assert done.exit_code == 0, done.output
    header, *table, summary = done.stdout.splitlines()
    assert columns(header) == ["HOST", "INDEX", "UUID", "NAME", "MEMORY", "FREE", "UTIL", "TEMP", "POWER", "STATE"]
    assert [columns(line) for line in table] == [
        ["host-a", "0", a0.uuid, a0.name, "24576 MiB", "23552 MiB", "live"],
        ["host-a", "1", a1.uuid, a1.name, "24576 MiB", "24576 MiB", "unhealthy: 3 CUDA errors in a row"],
        ["host-b", "0", b0.uuid, b0.name, "81920 MiB", "silent (no telemetry; last recorded 0 min ago)"],
    ]
    assert summary == "3 GPU(s) on 2 host(s); 1 silent, 1 unhealthy"


def test_local_shows_what_this_hosts_supervisor_would_discover(env, tmp_path):
    done = run(["gpus", "--local"], env | {"GPUQ_SIMULATED_GPUS": "24,48", "GPUQ_HOST_LABEL": "here"}, tmp_path)
    assert done.exit_code == 0, done.output
    first, _header, *rows = done.stdout.splitlines()
    assert first == "here: 2 GPU(s) from simulated"
    assert [columns(r)[:5] for r in rows] == [
        [str(g.index), g.uuid, g.name, f"{g.memory_total_mib} MiB", f"{g.memory_free_mib} MiB"]
        for g in simulated_inventory("here", [24, 48]).gpus
    ]
    nothing = run(["gpus", "--local"], env | {"GPUQ_SIMULATED_GPUS": None, "GPUQ_HOST_LABEL": "here"}, tmp_path)
    assert nothing.stdout == "here: no GPU found (NVML unavailable); workers run on the CPU\n"
