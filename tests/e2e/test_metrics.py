"""/metrics, job energy and GPU history with real processes: the API (two of them), a
supervisor on a simulated 24 GiB GPU and its worker, or a plain CPU worker, running the
bundled model. The counters must move by exactly what ran."""

import time
from collections.abc import Iterator

import httpx
import pytest

from gpuq import store
from gpuq.db.engine import sync_engine, sync_sessions
from tests.metrics_parsing import samples, total, value

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m"
MIB = 1 << 20


def gen(i: int) -> dict:
    return {"kind": "generate", "model": MODEL, "prompt": f"Count to {i + 3}:", "max_tokens": 5 + i, "temperature": 0}


def scrape(processes, url: str) -> dict:
    response = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {processes.admin_key}"}, timeout=30)
    assert response.status_code == 200, response.text
    return samples(response.text)


def scrape_once_counted(processes, url: str, jobs: int) -> dict:
    """Workers send their counts at most every 0.5 s (worker/outcome_writer.py): scrape until
    the finished jobs are in, for a few seconds at most."""
    deadline = time.monotonic() + 5
    while True:
        parsed = scrape(processes, url)
        if total(parsed, "gpuq_jobs_total") >= jobs or time.monotonic() > deadline:
            return parsed
        time.sleep(0.1)


@pytest.fixture
def sql(processes) -> Iterator:
    engine = sync_engine(processes.database_url)
    yield sync_sessions(engine)
    engine.dispose()


def test_metrics_count_exactly_what_a_simulated_gpu_worker_ran_and_record_no_energy(processes, sql):
    processes.settings |= {"GPUQ_SIMULATED_GPUS": "24", "GPUQ_GPU_SAMPLE_INTERVAL_S": "1"}
    _api, url = processes.start_api()
    _other_api, other_url = processes.start_api()
    with processes.client(url) as client:
        submitted = client.submit_many([gen(i) for i in range(3)] + [{"kind": "embed", "model": MODEL, "input": "hi"}])
        waiting = scrape(processes, url)
        assert value(waiting, "gpuq_queue_depth", model=MODEL, kind="generate", priority="normal") == 3
        assert value(waiting, "gpuq_queue_depth", model=MODEL, kind="embed", priority="normal") == 1
        assert total(waiting, "gpuq_jobs_total") == 0

        processes.start_supervisor(expected_workers=1)
        done = [client.wait(j["id"], timeout_s=180) for j in submitted]
        assert [j["status"] for j in done] == ["succeeded"] * 4, [j["error"] for j in done]
        gpu = client.gpus()[0]
        models = client.models()

    for job in done:  # nothing measured on a simulated GPU, so nothing recorded
        assert job["device"].startswith("simulated:GPU-SIM-")
        assert job["energy_j"] is None and job["gpu_seconds"] is None

    parsed = scrape_once_counted(processes, url, 4)
    generated = done[:3]
    assert value(parsed, "gpuq_jobs_total", model=MODEL, kind="generate", status="succeeded") == 3
    assert value(parsed, "gpuq_jobs_total", model=MODEL, kind="embed", status="succeeded") == 1
    assert total(parsed, "gpuq_jobs_total") == 4
    assert value(parsed, "gpuq_tokens_generated_total", model=MODEL) == sum(j["completion_tokens"] for j in generated)
    series = {"model": MODEL, "kind": "generate"}
    assert value(parsed, "gpuq_job_run_seconds_count", **series) == 3
    assert value(parsed, "gpuq_job_run_seconds_bucket", **series, le="+Inf") == 3
    assert value(parsed, "gpuq_job_run_seconds_sum", **series) == pytest.approx(
        sum(j["run_ms"] for j in generated) / 1000, abs=0.01
    )
    assert value(parsed, "gpuq_job_queue_wait_seconds_count", **series) == 3
    assert value(parsed, "gpuq_job_queue_wait_seconds_sum", **series) == pytest.approx(
        sum(j["queue_wait_ms"] for j in generated) / 1000, abs=0.01
    )
    assert value(parsed, "gpuq_model_loads_total", model=MODEL) == 2  # a generation and an embedding context
    assert value(parsed, "gpuq_model_load_seconds_count", model=MODEL) == 2
    assert total(parsed, "gpuq_queue_depth") == 0
    assert total(parsed, "gpuq_workers") == 1

    # The simulated GPU: its memory (total, and what its loaded model's VRAM figure uses) and nothing else.
    labels = {"gpu": gpu["uuid"], "host": gpu["host"], "name": gpu["name"]}
    assert value(parsed, "gpuq_gpu_memory_total_bytes", **labels) == 24 * 1024 * MIB
    vram_mib = next(m["vram_mib"] for m in models if m["id"] == MODEL)
    deadline = time.monotonic() + 15  # the supervisor publishes telemetry every 5 s
    while value(parsed, "gpuq_gpu_memory_used_bytes", **labels) != vram_mib * MIB and time.monotonic() < deadline:
        time.sleep(0.5)
        parsed = scrape(processes, url)
    assert value(parsed, "gpuq_gpu_memory_used_bytes", **labels) == vram_mib * MIB
    assert value(parsed, "gpuq_gpu_power_watts", **labels) is None
    assert value(parsed, "gpuq_gpu_utilization_ratio", **labels) is None

    label_values = {v for (_name, ls) in parsed for _k, v in ls}
    assert not {j["id"] for j in done} & label_values
    assert not {j["worker"] for j in done} & label_values  # worker names carry a pid: counted by host

    # Another API process renders the same counters: they live in Redis, not in the API.
    other = scrape(processes, other_url)
    counters = ("gpuq_jobs_total", "gpuq_tokens_generated_total", "gpuq_job_run_seconds_bucket")
    assert {k: v for k, v in other.items() if k[0] in counters} == {k: v for k, v in parsed.items() if k[0] in counters}

    with sql() as session:  # the supervisor's history in SQL: memory, and nulls for the rest
        rows = store.gpu_samples(session, gpu_uuid=gpu["uuid"])
    assert rows and {r.memory_total_mib for r in rows} == {24 * 1024}
    assert {(r.utilization_pct, r.power_w, r.temperature_c) for r in rows} == {(None, None, None)}


def test_a_job_on_a_cpu_worker_records_no_energy(processes):
    _api, url = processes.start_api()
    processes.start_worker()
    with processes.client(url) as client:
        job = client.wait(client.submit(gen(0))["id"], timeout_s=120)
    assert job["status"] == "succeeded" and job["device"] == "cpu"
    assert job["energy_j"] is None and job["gpu_seconds"] is None
    parsed = scrape_once_counted(processes, url, 1)
    assert value(parsed, "gpuq_jobs_total", model=MODEL, kind="generate", status="succeeded") == 1
    assert value(parsed, "gpuq_tokens_generated_total", model=MODEL) == job["completion_tokens"]
