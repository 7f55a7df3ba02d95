"""The fleet on a simulated four-GPU host (24, 24, 48 and 80 GiB): a real supervisor spawning
real worker processes, each pinned to one simulated GPU and running llama.cpp on the CPU."""

import os
import signal
import time
from pathlib import Path

import pytest
from redis import Redis
from rq.worker import Worker

from tests.e2e.conftest import environ

MODEL = "smollm2-135m"
FLEET = {
    "GPUQ_SIMULATED_GPUS": "24,24,48,80",
    "GPUQ_WORKER_THREADS": "1",
    "GPUQ_WORKER_TTL_S": "3",
    "GPUQ_WORKER_HEARTBEAT_INTERVAL_S": "0.5",
    "GPUQ_WORKER_REFRESH_INTERVAL_S": "1",
}
RULES_PICKED_UP_S = 2.5  # workers re-read rules every second here, without a restart


@pytest.fixture
def fleet(processes):
    processes.settings |= FLEET
    _api, url = processes.start_api()
    _supervisor, workers = processes.start_supervisor(expected_workers=4)
    with processes.client(url) as client:
        gpus = {g["index"]: g["uuid"] for g in client.gpus()}
        yield client, gpus, workers


def register_copy(client, processes, model_path, name, vram_mib):
    (Path(processes.workdir) / "models" / f"{name}.gguf").symlink_to(model_path)
    client.register_model({"name": name, "path": f"{name}.gguf", "kinds": ["generate"], "vram_mib": vram_mib})


def run_all(client, jobs, timeout_s=180):
    ids = [j["id"] for j in client.submit_many(jobs)]
    done = [client.wait(i, timeout_s=timeout_s) for i in ids]
    assert all(j["status"] == "succeeded" for j in done), [j["error"] for j in done]
    return done


def gen(model=MODEL, **extra):
    return {"kind": "generate", "model": model, "prompt": "Hi", "max_tokens": 2, "temperature": 0} | extra


def test_each_worker_is_pinned_to_its_gpu_by_uuid(fleet):
    _client, gpus, workers = fleet
    pinned = {}
    for worker in workers:
        env = environ(worker.pid)
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        pinned[env["CUDA_VISIBLE_DEVICES"]] = worker.name
    assert sorted(pinned) == sorted(gpus.values())
    for index, uuid in gpus.items():
        assert f".gpu{index}." in pinned[uuid] and uuid.startswith("GPU-SIM-")


def test_jobs_land_only_on_the_gpus_their_rules_allow(fleet):
    client, gpus, _workers = fleet
    client.add_rule({"model_pattern": MODEL, "kind": "generate", "effect": "allow", "gpu_indices": [0, 1]})
    client.add_rule({"model_pattern": MODEL, "kind": "embed", "effect": "allow", "gpu_indices": [2, 3]})
    time.sleep(RULES_PICKED_UP_S)
    jobs = [gen(prompt=f"Hi {i}") for i in range(8)]
    jobs += [{"kind": "embed", "model": MODEL, "input": f"text {i}"} for i in range(8)]
    done = run_all(client, jobs)
    generate_gpus = {j["device"].removeprefix("simulated:") for j in done if j["kind"] == "generate"}
    embed_gpus = {j["device"].removeprefix("simulated:") for j in done if j["kind"] == "embed"}
    assert generate_gpus <= {gpus[0], gpus[1]} and embed_gpus <= {gpus[2], gpus[3]}
    assert all(j["device"].startswith("simulated:GPU-SIM-") for j in done)


def test_a_model_too_big_for_the_24_gib_gpus_lands_only_on_the_80_gib_one(fleet, processes, model_path):
    client, gpus, _workers = fleet
    register_copy(client, processes, model_path, "big", vram_mib=60 * 1024)
    time.sleep(RULES_PICKED_UP_S)
    done = run_all(client, [gen("big", prompt=f"Hi {i}") for i in range(6)])
    assert {j["device"] for j in done} == {f"simulated:{gpus[3]}"}


def test_workers_stick_to_the_model_they_have_loaded(fleet, processes, model_path):
    client, gpus, _workers = fleet
    for name in ("a", "b"):  # 20 GiB each: one at a time on a 24 GiB GPU
        register_copy(client, processes, model_path, name, vram_mib=20 * 1024)
        client.add_rule({"model_pattern": name, "effect": "allow", "gpu_indices": [0, 1]})
    time.sleep(RULES_PICKED_UP_S)
    jobs = [gen(name, prompt=f"Hi {i}") for i in range(10) for name in ("a", "b")]  # a b a b ...
    done = run_all(client, jobs)
    loads = [j for j in done if j["load_ms"]]
    # FIFO order would swap models on almost every job; sticky workers load each model
    # once, plus at most once more each when a deep queue drains and they switch.
    assert len(loads) <= 4, [(j["model"], j["worker"]) for j in loads]
    assert {j["device"] for j in done} <= {f"simulated:{gpus[0]}", f"simulated:{gpus[1]}"}


def test_a_low_priority_job_is_not_starved_by_a_stream_of_high_ones(fleet, processes):
    client, _gpus, _workers = fleet
    processes.settings |= {"GPUQ_PRIORITY_AGING_S": "1", "GPUQ_RECONCILE_INTERVAL_S": "60"}
    processes.start_scheduler()
    client.add_rule({"model_pattern": MODEL, "effect": "allow", "gpu_indices": [0]})  # one worker serves it
    time.sleep(RULES_PICKED_UP_S)
    high = [
        j["id"] for j in client.submit_many([gen(prompt=f"Q{i}", max_tokens=24, priority="high") for i in range(40)])
    ]
    low = client.submit(gen(prompt="the low one", priority="low"))["id"]
    done_low = client.wait(low, timeout_s=120)
    highs = [client.wait(i, timeout_s=180) for i in high]
    after_low = [j for j in highs if j["started_at"] > done_low["started_at"]]
    # Two aging steps (low -> normal -> high, 1 s each) put it at the front of the high
    # queue: it runs before a good part of the backlog, not after all of it.
    assert len(after_low) >= 10, "the low job should overtake a good part of the high backlog"


def test_a_crashed_worker_is_restarted_and_its_job_retried(fleet, processes):
    client, gpus, _workers = fleet
    processes.settings |= {"GPUQ_RECONCILE_INTERVAL_S": "1", "GPUQ_RECONCILE_GRACE_S": "0"}
    processes.start_scheduler()
    client.add_rule({"model_pattern": MODEL, "effect": "allow", "gpu_indices": [1]})
    time.sleep(RULES_PICKED_UP_S)
    job = client.submit(gen(prompt="Count from 1 to 1000: 1, 2, 3,", max_tokens=300))
    deadline = time.monotonic() + 60
    while client.job(job["id"])["status"] != "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    running = client.job(job["id"])
    assert running["device"] == f"simulated:{gpus[1]}"
    redis = Redis.from_url(processes.redis_url)
    victim = next(w for w in Worker.all(connection=redis) if w.name == running["worker"])
    os.kill(victim.pid, signal.SIGKILL)
    done = client.wait(job["id"], timeout_s=120)
    assert done["status"] == "succeeded" and done["attempts"] == 2
    assert done["worker"] != victim.name and ".gpu1." in done["worker"]  # the restarted gpu1 worker
    redis.close()


def test_a_model_no_single_gpu_holds_runs_on_a_gpu_group_worker(fleet, processes, model_path):
    client, gpus, _workers = fleet
    register_copy(client, processes, model_path, "huge", vram_mib=100 * 1024)  # 80 + 48 GiB hold it
    redis = Redis.from_url(processes.redis_url)
    deadline = time.monotonic() + 30
    group = None
    while group is None and time.monotonic() < deadline:  # the supervisor plans groups every 5 s
        group = next((w for w in Worker.all(connection=redis) if ".group2+3." in w.name), None)
        time.sleep(0.2)
    redis.close()
    assert group is not None, "the supervisor should have started a worker for GPUs 2 and 3"
    assert environ(group.pid)["CUDA_VISIBLE_DEVICES"] == f"{gpus[2]},{gpus[3]}"
    done = run_all(client, [gen("huge"), gen(MODEL)])
    assert done[0]["device"] == f"simulated:{gpus[2]},{gpus[3]}" and done[0]["worker"] == group.name
    assert "," not in done[1]["device"]  # models a single GPU holds stay on single-GPU workers
