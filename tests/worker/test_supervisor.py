"""The supervisor's slot plan, restart backoff and drain, with real child processes; and
GPU health as only the supervisor sees it (lost GPUs, workers aborting), with NVML answered
by the stand-in (tests/nvml_standin)."""

import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from gpuq import store
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import Gpu
from gpuq.fleet import telemetry
from gpuq.fleet.gpus import Inventory, discover_gpus, simulated_inventory
from gpuq.redis_keys import METRICS_RESTARTS
from gpuq.settings import Settings
from tests.conftest import both_databases
from tests.nvml_standin import StandinMig, gpu_uuid, mig_uuid
from worker.exits import EXIT_DEFECT, EXIT_DEVICE_UNUSABLE, EXIT_OUTAGE
from worker.supervisor import (
    SlotPlan,
    Supervisor,
    plan_slots,
    threads_per_worker,
    worker_command,
    worker_environment,
)


def test_one_slot_per_gpu_pinned_by_uuid_or_cpu_slots_without_gpus():
    inventory = simulated_inventory("node1", [24, 80])
    slots = plan_slots(inventory)
    assert slots == [SlotPlan("gpu0", (inventory.gpus[0].uuid,)), SlotPlan("gpu1", (inventory.gpus[1].uuid,))]
    assert [s.name for s in plan_slots(inventory, slots_per_gpu=2)] == ["gpu0-0", "gpu0-1", "gpu1-0", "gpu1-1"]
    assert plan_slots(Inventory("node1", "none", ()), cpu_workers=2) == [SlotPlan("cpu0", ()), SlotPlan("cpu1", ())]


def test_a_worker_is_spawned_with_its_gpu_visible_and_nothing_else():
    slot = SlotPlan("gpu3", ("GPU-abc",))
    env = worker_environment(slot, {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "PATH": "/bin"}, threads=4)
    assert env == {
        "CUDA_VISIBLE_DEVICES": "GPU-abc",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "GPUQ_WORKER_THREADS": "4",
        "PATH": "/bin",
    }
    assert worker_command(slot)[-4:] == ["--slot", "gpu3", "--gpus", "GPU-abc"]
    assert worker_environment(SlotPlan("cpu0", ()), {}, threads=1)["CUDA_VISIBLE_DEVICES"] == ""


def test_a_hosts_cores_are_shared_out_among_its_workers_unless_threads_are_set():
    automatic = Settings(worker_threads=0)
    assert threads_per_worker(automatic, 4, cores=2) == 1  # four simulated GPUs on two cores: one each
    assert threads_per_worker(automatic, 4, cores=64) == 16
    assert threads_per_worker(automatic, 3, cores=8) == 2
    assert threads_per_worker(Settings(worker_threads=6), 4, cores=2) == 6  # as configured


def test_mig_devices_get_a_slot_each_and_shared_gpus_say_so_to_their_workers(nvml):
    nvml.gpus[0].mig_mode, nvml.gpus[0].max_mig = True, 7
    nvml.gpus[0].migs = [StandinMig(mig_uuid(0, 0), slot=0), StandinMig(mig_uuid(0, 1), slot=1)]
    nvml.write()
    slots = plan_slots(discover_gpus(host="node1"))
    assert slots == [
        SlotPlan("gpu0-mig0", (mig_uuid(0, 0),)),
        SlotPlan("gpu0-mig1", (mig_uuid(0, 1),)),
        SlotPlan("gpu1", (gpu_uuid(1),)),
    ]
    shared = plan_slots(discover_gpus(host="node1"), slots_per_gpu=2)
    assert worker_command(shared[0])[-6:] == ["--slot", "gpu0-mig0-0", "--gpus", mig_uuid(0, 0), "--gpu-share", "2"]


def make_supervisor(database_url, redis, command, inventory=None, **options):
    spawned = []

    def spawn(slot):
        spawned.append(slot.name)
        return subprocess.Popen([sys.executable, "-c", command])

    engine = sync_engine(database_url)
    supervisor = Supervisor(
        settings=Settings(database_url=database_url, redis_url="redis://unused"),
        inventory=inventory or simulated_inventory("node1", [24]),
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
    # Each death's restart delay, as the supervisor scheduled it: bracketed by the clock read
    # just before and just after the check that saw the death (so no timing can make it flaky).
    delays: list[tuple[float, float]] = []
    deadline = time.monotonic() + 60
    while len(spawned) < 4 and time.monotonic() < deadline:
        child = supervisor.children[0]
        alive, before_s = child.process is not None, time.monotonic()
        supervisor.check()
        after_s = time.monotonic()
        if alive and child.process is None:
            delays.append((child.next_start_at - after_s, child.next_start_at - before_s))
        time.sleep(0.02)
    engine.dispose()
    assert len(spawned) == 4 and supervisor.children[0].restarts == 3
    assert len(delays) == 3
    for (shortest, longest), expected in zip(delays, [0.2, 0.4, 0.8], strict=True):  # 0.2 s, doubling
        assert shortest - 1e-6 <= expected <= longest + 1e-6


def test_draining_lets_workers_finish_on_sigterm(database_url, redis, tmp_path):
    # A stand-in worker that, like RQ's warm shutdown, finishes its current work on SIGTERM:
    # it says when its handler is in place, and leaves a mark once that work is done.
    ready, finished = tmp_path / "ready", tmp_path / "finished"
    finishing = (
        "import pathlib, signal, sys, time\n"
        f"def finish(*_):\n    time.sleep(0.5)\n    pathlib.Path({str(finished)!r}).touch()\n    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, finish)\n"
        f"pathlib.Path({str(ready)!r}).touch()\n"
        "time.sleep(60)\n"
    )
    supervisor, _spawned, engine = make_supervisor(database_url, redis, finishing)
    supervisor.start()
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    supervisor.drain(timeout_s=60)
    engine.dispose()
    # Its work finished, and it exited by itself (a worker killed at the drain's end has no mark
    # and a negative return code).
    assert finished.exists() and supervisor.children[0].process.returncode == 0


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


def gpu_rows(engine):
    with sync_sessions(engine)() as session:
        return {g.uuid: g for g in store.list_gpus(session)}


def test_a_gpu_lost_before_the_start_gets_no_worker_and_the_others_do(nvml, database_url, redis):
    sleeper = "import time; time.sleep(60)"
    first, _spawned, engine = make_supervisor(database_url, redis, sleeper, inventory=discover_gpus(host="node1"))
    first.start()  # an earlier run recorded both GPUs
    first.drain(timeout_s=5)
    nvml.lose(1)
    supervisor, spawned, _engine = make_supervisor(database_url, redis, sleeper, inventory=discover_gpus(host="node1"))
    supervisor.start()
    supervisor.drain(timeout_s=5)
    assert spawned == ["gpu0"]  # not a supervisor that died at start: the healthy GPU is served
    rows = gpu_rows(engine)
    assert rows[gpu_uuid(0)].healthy and not rows[gpu_uuid(1)].healthy
    assert "GPU is lost" in rows[gpu_uuid(1)].unhealthy_reason
    engine.dispose()


def test_a_gpu_lost_while_running_is_marked_unhealthy_and_the_others_keep_their_telemetry(nvml, database_url, redis):
    sleeper = "import time; time.sleep(60)"
    supervisor, _spawned, engine = make_supervisor(
        database_url, redis, sleeper, inventory=discover_gpus(host="node1"), telemetry_interval_s=0.2
    )
    supervisor.settings = Settings(database_url=database_url, redis_url="redis://unused", gpu_sample_interval_s=0.2)
    runner = threading.Thread(target=supervisor.run)
    runner.start()
    try:
        deadline = time.monotonic() + 10
        while set(telemetry.read(redis, [gpu_uuid(0), gpu_uuid(1)])) != {gpu_uuid(0), gpu_uuid(1)}:
            assert time.monotonic() < deadline, "no telemetry published"
            time.sleep(0.1)
        nvml.lose(1)
        lost_at = time.time()
        while gpu_rows(engine)[gpu_uuid(1)].healthy:
            assert time.monotonic() < deadline + 10, "the lost GPU was never marked"
            time.sleep(0.1)
        time.sleep(1.0)  # a few more rounds
        live = telemetry.read(redis, [gpu_uuid(0), gpu_uuid(1)])
        with sync_sessions(engine)() as session:
            after = [r for r in store.gpu_samples(session) if r.sampled_at.timestamp() > lost_at + 0.5]
    finally:
        supervisor.request_stop()
        runner.join(timeout=30)
    assert "GPU is lost" in gpu_rows(engine)[gpu_uuid(1)].unhealthy_reason
    assert gpu_uuid(0) in live and gpu_uuid(1) not in live  # the healthy GPU is still live, the lost one is not
    assert after and {r.gpu_uuid for r in after} == {gpu_uuid(0)}
    engine.dispose()


def test_a_worker_aborting_three_times_marks_its_gpu_unhealthy(database_url, redis):
    # ggml aborts on a CUDA error: the process dies with SIGABRT before any count in it can grow.
    supervisor, spawned, engine = make_supervisor(database_url, redis, "import os; os.abort()", backoff_start_s=0.05)
    supervisor.start()
    uuid = supervisor.inventory.gpus[0].uuid
    deadline = time.monotonic() + 20
    while len(spawned) < 4 and time.monotonic() < deadline:
        supervisor.check()
        time.sleep(0.02)
    supervisor.drain(timeout_s=5)
    row = gpu_rows(engine)[uuid]
    assert not row.healthy and "exited abnormally 3 times" in row.unhealthy_reason
    assert "killed by SIGABRT" in row.unhealthy_reason
    engine.dispose()


@pytest.mark.parametrize("code", [0, EXIT_DEVICE_UNUSABLE, EXIT_OUTAGE, EXIT_DEFECT])
def test_clean_exits_refusals_outages_and_defects_are_not_held_against_the_gpu(database_url, redis, code):
    supervisor, spawned, engine = make_supervisor(
        database_url, redis, f"import sys; sys.exit({code})", backoff_start_s=0.05
    )
    supervisor.start()
    deadline = time.monotonic() + 20
    while len(spawned) < 5 and time.monotonic() < deadline:
        supervisor.check()
        time.sleep(0.02)
    supervisor.drain(timeout_s=5)
    assert len(spawned) == 5 and gpu_rows(engine)[supervisor.inventory.gpus[0].uuid].healthy
    engine.dispose()


def test_a_cpu_host_runs_cpu_workers_but_a_host_whose_gpus_are_all_lost_does_not(nvml):
    assert plan_slots(Inventory("node1", "none", ()), cpu_workers=1) == [SlotPlan("cpu0", ())]
    nvml.lose(0)
    nvml.lose(1)
    inventory = discover_gpus(host="node1")
    assert inventory.gpus == () and len(inventory.unreadable) == 2
    assert plan_slots(inventory, cpu_workers=1) == []


def test_gpu_rows_are_only_those_nvml_reads(nvml, database_url, redis):
    nvml.lose(1)
    supervisor, _spawned, engine = make_supervisor(
        database_url, redis, "import time; time.sleep(60)", inventory=discover_gpus(host="node1")
    )
    supervisor.start()
    supervisor.drain(timeout_s=5)
    assert list(gpu_rows(engine)) == [gpu_uuid(0)] and isinstance(gpu_rows(engine)[gpu_uuid(0)], Gpu)
    engine.dispose()


@both_databases
def test_a_killed_worker_is_recorded_as_crashed_with_its_signal_then_restarted_and_counted(database_url, redis):
    sleeper = "import time; time.sleep(60)"
    supervisor, spawned, engine = make_supervisor(database_url, redis, sleeper, backoff_start_s=0.05)
    supervisor.start()
    first = supervisor.children[0].process
    first.send_signal(signal.SIGKILL)  # no goodbye, as a CUDA abort or the OOM killer
    first.wait()
    deadline = time.monotonic() + 10
    while len(spawned) < 2 and time.monotonic() < deadline:
        supervisor.check()
        time.sleep(0.02)
    second = supervisor.children[0].process
    supervisor.drain(timeout_s=5)  # SIGTERM: the stand-in dies of it, as asked
    with sync_sessions(engine)() as session:
        events, _more = store.list_events(session, store.EventFilter(slot="gpu0"), limit=10)
    engine.dispose()
    uuid = supervisor.inventory.gpus[0].uuid
    seen = [(e.kind, e.worker, e.exit_status, e.detail) for e in reversed(events)]
    me = socket.gethostname()
    assert seen == [
        ("started", f"{me}.gpu0.{first.pid}", None, None),
        ("crashed", f"{me}.gpu0.{first.pid}", -signal.SIGKILL, "crashed: killed by SIGKILL"),
        (
            "restarted",
            f"{me}.gpu0.{second.pid}",
            None,
            "restart 1 of this slot by its supervisor, after its worker crashed: killed by SIGKILL",
        ),
        (
            "stopped",
            f"{me}.gpu0.{second.pid}",
            -signal.SIGTERM,
            "stopped when asked (killed by SIGTERM) (its supervisor stopped and drained it)",
        ),
    ]
    assert {(e.host, e.gpu_uuids) for e in events} == {("node1", uuid)}
    assert redis.hget(METRICS_RESTARTS, "node1\tgpu0") == b"1"  # gpuq_worker_restarts_total on /metrics


def test_a_worker_that_died_just_before_its_supervisor_stopped_is_recorded_too(database_url, redis):
    supervisor, _spawned, engine = make_supervisor(database_url, redis, "import time; time.sleep(60)")
    supervisor.start()
    child = supervisor.children[0].process
    child.send_signal(signal.SIGKILL)
    child.wait()
    supervisor.drain(timeout_s=5)  # before any check() saw the death
    with sync_sessions(engine)() as session:
        events, _more = store.list_events(session, store.EventFilter(slot="gpu0"), limit=10)
    engine.dispose()
    assert [(e.kind, e.detail) for e in reversed(events)] == [
        ("started", None),
        ("crashed", "crashed: killed by SIGKILL"),
    ]
