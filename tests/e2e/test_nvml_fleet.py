"""The fleet on NVML: a real supervisor and real workers whose pynvml loads the NVML stand-in
(tests/nvml_standin) through LD_LIBRARY_PATH, as it would load NVIDIA's library on a GPU
host. Discovery, pinning, telemetry in /v1/gpus and /metrics, GPU samples, energy per job
and lost GPUs all go through pynvml's real code path; llama.cpp runs on the CPU, so the
workers' offload check is switched off (GPUQ_WORKER_OFFLOAD_CHECK=false) except where the
test is that check."""

import time

import httpx
import pytest
from redis import Redis
from rq.worker import Worker

from gpuq import store
from gpuq.db.engine import sync_engine, sync_sessions
from tests.e2e.conftest import environ, until
from tests.metrics_parsing import samples, value
from tests.nvml_standin import gpu_uuid

MODEL = "smollm2-135m"
FAST = {
    "GPUQ_WORKER_THREADS": "1",
    "GPUQ_WORKER_TTL_S": "3",
    "GPUQ_WORKER_HEARTBEAT_INTERVAL_S": "0.5",
    "GPUQ_WORKER_REFRESH_INTERVAL_S": "1",
    "GPUQ_GPU_SAMPLE_INTERVAL_S": "1",
}
POWER_W = {gpu_uuid(0): 100.0, gpu_uuid(1): 30.0}  # the stand-in's defaults (tests/conftest.py)


def by_uuid(client) -> dict:
    return {g["uuid"]: g for g in client.gpus()}


def test_supervisor_workers_telemetry_and_energy_run_through_pynvml(nvml, processes):
    processes.settings |= nvml.env | FAST | {"GPUQ_WORKER_OFFLOAD_CHECK": "false"}
    _api, url = processes.start_api()
    supervisor, workers = processes.start_supervisor(expected_workers=2)
    assert {environ(w.pid)["CUDA_VISIBLE_DEVICES"] for w in workers} == {gpu_uuid(0), gpu_uuid(1)}
    with processes.client(url) as client:
        gpus = until(
            "live telemetry of both GPUs", lambda: (g := by_uuid(client)) and all(x["live"] for x in g.values()) and g
        )
        first, second = gpus[gpu_uuid(0)], gpus[gpu_uuid(1)]
        assert (first["name"], first["memory_total_mib"], first["simulated"]) == ("NVIDIA A100-SXM4-80GB", 81920, False)
        assert (first["utilisation_pct"], first["temperature_c"], first["power_w"]) == (5, 41, 100.0)
        assert (second["name"], second["power_w"], second["temperature_c"]) == ("NVIDIA L4", 30.0, 38)

        jobs = [
            {"kind": "generate", "model": MODEL, "prompt": "Count: 1, 2, 3,", "max_tokens": 24, "temperature": 0},
            {"kind": "embed", "model": MODEL, "input": ["energy is power times time"]},
        ]
        done = [client.wait(j["id"], timeout_s=180) for j in client.submit_many(jobs)]
        for job in done:
            assert job["status"] == "succeeded", job["error"]
            uuid = job["device"].removeprefix("cuda:")
            assert uuid in POWER_W, job["device"]  # a pinned worker, on its GPU, accounted as such
            # Each ran alone, so it is charged the GPU's whole energy: NVML's counter, at the stand-in's power.
            assert job["energy_share"] == 1.0
            assert job["energy_j"] == pytest.approx(POWER_W[uuid] * job["gpu_seconds"], rel=0.05)

        metrics = samples(httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {processes.admin_key}"}).text)
        labels = {"gpu": gpu_uuid(0), "host": first["host"], "name": first["name"]}
        assert value(metrics, "gpuq_gpu_power_watts", **labels) == 100.0
        assert value(metrics, "gpuq_gpu_utilization_ratio", **labels) == 0.05
        assert value(metrics, "gpuq_gpu_temperature_celsius", **labels) == 41

        # GPU 1 falls off the bus: it is marked unhealthy and stops being live; GPU 0 carries on.
        nvml.lose(1)
        lost = until("GPU 1 marked unhealthy", lambda: not (g := by_uuid(client))[gpu_uuid(1)]["healthy"] and g)
        assert "GPU is lost" in lost[gpu_uuid(1)]["unhealthy_reason"]
        until("GPU 1 no longer live", lambda: not by_uuid(client)[gpu_uuid(1)]["live"], timeout_s=10)
        assert by_uuid(client)[gpu_uuid(0)]["live"]
        time.sleep(2.5)  # the lost GPU's worker re-reads its GPU's health within a second or two
        after = [client.wait(j["id"], timeout_s=180) for j in client.submit_many(jobs)]
        assert {j["device"] for j in after} == {f"cuda:{gpu_uuid(0)}"}
        assert all(j["status"] == "succeeded" for j in after)
    engine = sync_engine(processes.database_url)
    with sync_sessions(engine)() as session:
        history = store.gpu_samples(session, gpu_uuid=gpu_uuid(0))
    engine.dispose()
    assert history and {(r.power_w, r.temperature_c, r.utilization_pct) for r in history} == {(100.0, 41, 5)}
    called = {name for _pid, name in nvml.calls()}
    assert {"nvmlDeviceGetHandleByUUID", "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetPowerUsage"} <= called
    assert supervisor.popen.poll() is None


def test_a_worker_pinned_to_a_gpu_llama_cpp_cannot_use_refuses_to_start(nvml, processes):
    """llama-cpp-python here is a CPU build: on a GPU host that is the 'pinned worker silently
    on the CPU' defect, so every pinned worker must refuse and its GPU be marked unhealthy."""
    processes.settings |= nvml.env | FAST  # the offload check on, as on a real fleet
    _api, url = processes.start_api()
    supervisor, _none = processes.start_supervisor(expected_workers=0)
    with processes.client(url) as client:
        gpus = until(
            "both GPUs marked unhealthy",
            lambda: (g := client.gpus()) and len(g) == 2 and not any(x["healthy"] for x in g) and g,
        )
        for gpu in gpus:
            assert "CPU build of llama-cpp-python" in gpu["unhealthy_reason"], gpu
        job = client.submit({"kind": "noop", "model": MODEL})
        time.sleep(2)
        assert client.job(job["id"])["status"] == "queued"  # no CPU worker took it in the GPUs' place
    redis = Redis.from_url(processes.redis_url)
    assert Worker.all(connection=redis) == []
    redis.close()
    assert supervisor.popen.poll() is None  # the supervisor carries on, retrying with backoff
    assert "refused to start on its GPUs" in supervisor.log.read_text()
