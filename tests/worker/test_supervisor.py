"""The supervisor's slot plan, restart backoff and drain, with real child processes."""

import itertools
import subprocess
import sys
import threading
import time

import pytest

from gpuq import store
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.fleet.gpus import Inventory, simulated_inventory
from gpuq.settings import Settings
from worker.supervisor import SlotPlan, Supervisor, plan_slots, worker_command, worker_environment


def test_one_slot_per_gpu_pinned_by_uuid_or_cpu_slots_without_gpus():
    inventory = simulated_inventory("node1", [24, 80])
    slots = plan_slots(inventory)
    assert slots == [SlotPlan("gpu0", (inventory.gpus[0].uuid,)), SlotPlan("gpu1", (inventory.gpus[1].uuid,))]
    assert [s.name for s in plan_slots(inventory, slots_per_gpu=2)] == ["gpu0-0", "gpu0-1", "gpu1-0", "gpu1-1"]
    assert plan_slots(Inventory("node1", "none", ()), cpu_workers=2) == [SlotPlan("cpu0", ()), SlotPlan("cpu1", ())]


def test_a_worker_is_spawned_with_its_gpu_visible_and_nothing_else():
    slot = SlotPlan("gpu3", ("GPU-abc",))
    env = worker_environment(slot, {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "PATH": "/bin"})
    assert env == {"CUDA_VISIBLE_DEVICES": "GPU-abc", "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "PATH": "/bin"}
    assert worker_command(slot)[-4:] == ["--slot", "gpu3", "--gpus", "GPU-abc"]
    assert worker_environment(SlotPlan("cpu0", ()), {})["CUDA_VISIBLE_DEVICES"] == ""


def make_supervisor(database_url, redis, command, **options):
    spawned = []

    def spawn(slot):
        spawned.append(slot.name)
        return subprocess.Popen([sys.executable, "-c", command])

    engine = sync_engine(database_url)
    supervisor = Supervisor(
        settings=Settings(database_url=database_url, redis_url="redis://unused"),
        inventory=simulated_inventory("node1", [24]),
        spawn=spawn,
        sessions=sync_sessions(engine),
        redis=redis,
        **options,
    )
    return supervisor, spawned, engine


def test_a_dead_worker_is_restarted_with_growing_backoff(database_url, redis):
    supervisor, spawned, engine = make_supervisor(database_url, redis, "import sys; sys.exit(3)", backoff_start_s=0.2)
    supervisor.start()
    with sync_sessions(engine)() as session:
        assert [g.name for g in store.list_gpus(session)] == ["Simulated GPU 24 GiB (simulated)"]
    restarts_at = []
    deadline = time.monotonic() + 10
    while len(spawned) < 4 and time.monotonic() < deadline:
        before = len(spawned)
        supervisor.check()
        if len(spawned) > before:
            restarts_at.append(time.monotonic())
        time.sleep(0.02)
    engine.dispose()
    assert len(spawned) == 4 and supervisor.children[0].restarts == 3
    gaps = [b - a for a, b in itertools.pairwise(restarts_at)]
    assert gaps[0] == pytest.approx(0.4, abs=0.15) and gaps[1] == pytest.approx(0.8, abs=0.2)  # 0.2 s, doubling


def test_draining_lets_workers_finish_on_sigterm(database_url, redis):
    # A stand-in worker that, like RQ's warm shutdown, finishes its current work on SIGTERM.
    finishing = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.5), sys.exit(0)))\n"
        "time.sleep(60)\n"
    )
    supervisor, _spawned, engine = make_supervisor(database_url, redis, finishing)
    supervisor.start()
    time.sleep(0.5)
    started = time.monotonic()
    supervisor.drain(timeout_s=10)
    engine.dispose()
    assert supervisor.children[0].process.returncode == 0
    assert 0.4 < time.monotonic() - started < 5


def test_a_running_supervisor_records_gpu_samples_and_prunes_old_ones(database_url, redis):
    from datetime import timedelta

    from gpuq.db.tables import utcnow

    sleeper = "import time; time.sleep(60)"
    supervisor, _spawned, engine = make_supervisor(database_url, redis, sleeper)
    supervisor.settings = Settings(
        database_url=database_url, redis_url="redis://unused", gpu_sample_interval_s=0.5, gpu_sample_retention_days=1
    )
    sessions = sync_sessions(engine)
    uuid = supervisor.inventory.gpus[0].uuid
    with sessions() as session:  # a sample from before the retention window
        store.record_gpu_samples(session, "node1", supervisor.inventory.gpus, at=utcnow() - timedelta(days=2))
    runner = threading.Thread(target=supervisor.run)
    runner.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with sessions() as session:
                rows = store.gpu_samples(session, gpu_uuid=uuid)
            if len(rows) >= 3:
                break
            time.sleep(0.2)
    finally:
        supervisor.request_stop()
        runner.join(timeout=30)
    engine.dispose()
    assert len(rows) >= 3  # every 0.5 s, not every 5 s (the Redis telemetry period)
    assert all(utcnow() - r.sampled_at < timedelta(minutes=1) for r in rows)  # the old one was pruned
    # What the simulation reports (memory), and nulls for what it does not have.
    assert {(r.memory_total_mib, r.memory_used_mib, r.host) for r in rows} == {(24 * 1024, 0, "node1")}
    assert {(r.utilization_pct, r.temperature_c, r.power_w) for r in rows} == {(None, None, None)}
