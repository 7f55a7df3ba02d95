"""Preemption by priority with a real API and a real worker process (issue 41 item 4): with
every slot decoding a long low-priority answer, a high-priority job runs at once (a low one
parked for it, its KV in host memory) and finishes while the low ones still decode; the parked
job resumes and ends with the very text it gives when nothing interrupts it, still on its first
attempt; the job says how long it waited parked, and /metrics counts the park and the resume."""

from __future__ import annotations

import time

import httpx

from gpuq.cli.client import GpuqClient
from tests.e2e.conftest import wait_until
from tests.metrics_parsing import samples, total

MODEL = "smollm2-135m"
SLOTS = 2
# Openings the bundled model goes on from for 160 tokens and more, greedy (it ends a question at once).
OPENINGS = ["Once upon a time, in a small village by the sea,", "The history of the lighthouse begins"]


def _low(i: int) -> dict:
    return {
        "kind": "generate",
        "model": MODEL,
        "prompt": OPENINGS[i % len(OPENINGS)],
        "max_tokens": 160,
        "temperature": 0,
        "priority": "low",
    }


URGENT = {"kind": "generate", "model": MODEL, "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0}


def test_a_high_job_parks_a_low_one_which_resumes_with_its_own_text(processes):
    processes.settings |= {"GPUQ_WORKER_SLOTS": str(SLOTS)}
    _api, url = processes.start_api()
    processes.start_worker()
    with GpuqClient(url, api_key=processes.admin_key) as client:
        # Uninterrupted first: the texts the low jobs give when nothing parks them.
        alone = [client.wait(client.submit(_low(i))["id"]) for i in range(SLOTS)]
        assert all(j["status"] == "succeeded" and j["completion_tokens"] > 100 for j in alone), alone
        low_ids = [j["id"] for j in client.submit_many([_low(i) for i in range(SLOTS)])]
        wait_until(lambda: all(client.job(i)["status"] == "running" for i in low_ids), "the low jobs never started", 60)
        time.sleep(1.0)  # both decoding
        urgent = client.wait(client.submit(URGENT | {"priority": "high"})["id"])
        assert urgent["status"] == "succeeded", urgent
        running = [client.job(i) for i in low_ids]
        # It did not wait for a slot: both low jobs were still decoding when it finished.
        assert [j["status"] for j in running] == ["running"] * SLOTS, running
        lows = [client.wait(i) for i in low_ids]

    assert [j["status"] for j in lows] == ["succeeded"] * SLOTS
    assert [j["result"] for j in lows] == [j["result"] for j in alone]  # parked or not, the same text
    assert all(j["attempts"] == 1 for j in lows)  # parked is running: never requeued, no attempt charged
    parked = [j for j in lows if j["parked_ms"]]
    assert [j["id"] for j in parked] == [low_ids[-1]]  # the newest of the least urgent
    assert parked[0]["parked_ms"] > 0 and urgent["parked_ms"] == 0
    admin = {"Authorization": f"Bearer {processes.admin_key}"}
    metrics = samples(httpx.get(f"{url}/metrics", headers=admin, timeout=30).text)
    assert total(metrics, "gpuq_sequences_parked_total", model=MODEL) == 1
    assert total(metrics, "gpuq_sequences_resumed_total", model=MODEL) == 1
