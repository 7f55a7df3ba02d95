"""Continuous batching through the whole path: one worker process decodes several jobs of a
model at once, each keeping its own text, RQ bookkeeping and history row, and priorities
across models still hold."""

import itertools
import time
from datetime import datetime
from pathlib import Path

from redis import Redis
from rq.registry import StartedJobRegistry

from tests.e2e.conftest import reconcile
from tests.worker.generation import engine_like_llama

MODEL = "smollm2-135m"
PROMPTS = [
    "The three primary colours are",
    "Count: 1, 2, 3,",
    "Question: name a fruit that is yellow. Answer:",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The capital of France is",
]
MAX_TOKENS = 48


def _direct(model_path: str, prompt: str) -> tuple[str, int, str]:
    """llama.cpp's own text, length and ending for the prompt, computed as the engine computes."""
    llm = engine_like_llama(model_path, n_ctx=2048, logits_all=False)
    try:
        completion = llm.create_completion(prompt, max_tokens=MAX_TOKENS, temperature=0.0, seed=1)
        assert isinstance(completion, dict)  # not a stream
        choice = completion["choices"][0]
        return choice["text"], completion["usage"]["completion_tokens"], choice["finish_reason"]
    finally:
        llm.close()


def _at(job: dict, field: str) -> datetime:
    return datetime.fromisoformat(job[field])


def test_one_worker_runs_several_generations_at_once_each_with_its_own_text(processes, model_path):
    processes.settings["GPUQ_WORKER_SLOTS"] = "4"
    _api, url = processes.start_api()
    _worker, name = processes.start_worker()
    redis = Redis.from_url(processes.redis_url)
    started = StartedJobRegistry(f"gpuq:{MODEL}:generate:normal:admin", connection=redis)
    with processes.client(url) as client:
        bodies = [{"kind": "generate", "model": MODEL, "prompt": p, "max_tokens": MAX_TOKENS} for p in PROMPTS]
        jobs = client.submit_many([b | {"temperature": 0, "seed": 1} for b in bodies])
        most_started = 0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            most_started = max(most_started, started.count)  # what `rq info` counts as running
            if all(client.job(j["id"])["status"] == "succeeded" for j in jobs):
                break
            time.sleep(0.05)
        done = [client.job(j["id"]) for j in jobs]
    redis.close()

    assert [j["status"] for j in done] == ["succeeded"] * len(PROMPTS)
    assert most_started >= 3  # RQ saw several of them started at the same time, on one worker
    assert {j["worker"] for j in done} == {name}
    # At some moment at least three jobs were running together (their run times overlap).
    overlaps = max(
        sum(_at(o, "started_at") <= _at(j, "started_at") < _at(o, "finished_at") for o in done) for j in done
    )
    assert overlaps >= 3
    for prompt, job in zip(PROMPTS, done, strict=True):
        text, completion_tokens, finish_reason = _direct(model_path, prompt)
        assert job["result"]["text"] == text, prompt
        assert job["result"]["finish_reason"] == finish_reason and job["completion_tokens"] == completion_tokens
        assert job["attempts"] == 1
    assert started.count == 0  # every execution was cleaned up


def test_a_high_job_of_another_model_is_not_held_behind_the_admission_of_low_ones(processes, model_path):
    processes.settings |= {"GPUQ_WORKER_SLOTS": "2", "GPUQ_WORKER_REFRESH_INTERVAL_S": "0.5"}
    (Path(processes.workdir) / "models" / "other.gguf").symlink_to(model_path)
    _api, url = processes.start_api()
    processes.start_worker()
    with processes.client(url) as client:
        client.register_model({"name": "other", "path": "other.gguf"})
        time.sleep(2)  # the worker re-reads what it serves every 0.5 s: it now listens on other's queues
        low = {"kind": "generate", "model": MODEL, "prompt": "Count: 1, 2, 3,", "priority": "low", "temperature": 0}
        # Different lengths, so the run always has a sequence ending while others go on.
        lows = client.submit_many([low | {"max_tokens": 60 + 30 * i} for i in range(6)])
        deadline = time.monotonic() + 60
        while client.job(lows[0]["id"])["status"] == "queued" and time.monotonic() < deadline:
            time.sleep(0.05)
        high = {"kind": "generate", "model": "other", "prompt": "Hello", "max_tokens": 8, "priority": "high"}
        high = client.submit(high)
        high_done = client.wait(high["id"], timeout_s=120)
        lows_done = [client.wait(j["id"], timeout_s=300) for j in lows]

    assert high_done["status"] == "succeeded"
    assert all(j["status"] == "succeeded" for j in lows_done)
    # The two low jobs running when it came finish; the four still queued start after it.
    after = [j for j in lows_done if _at(j, "started_at") > _at(high_done, "started_at")]
    assert len(after) >= 4


def test_waiting_embedding_jobs_of_a_model_are_embedded_together_each_with_its_own_result(processes):
    _api, url = processes.start_api()
    processes.start_worker()
    texts = [[f"sentence {i} about {topic}" for topic in ("rivers", "stars", "bread")] for i in range(5)]
    with processes.client(url) as client:
        # A generation keeps the worker busy while the embedding jobs queue up behind it.
        busy = client.submit({"kind": "generate", "model": MODEL, "prompt": "Count: 1, 2,", "max_tokens": 100})
        embeds = client.submit_many([{"kind": "embed", "model": MODEL, "input": t} for t in texts])
        client.wait(busy["id"], timeout_s=120)
        together = [client.wait(j["id"], timeout_s=120) for j in embeds]
        alone = client.wait(client.submit({"kind": "embed", "model": MODEL, "input": texts[3]})["id"])

    assert all(j["status"] == "succeeded" for j in together)
    # One run took them all: each was claimed before any of them finished.
    assert max(_at(j, "started_at") for j in together) < min(_at(j, "finished_at") for j in together)
    # Each job still has its own vectors and token count, as if it had run alone.
    assert [len(j["result"]["embeddings"]) for j in together] == [3] * 5
    assert together[3]["prompt_tokens"] == alone["prompt_tokens"] > 0
    for mine, reference in zip(together[3]["result"]["embeddings"], alone["result"]["embeddings"], strict=True):
        assert sum(a * b for a, b in zip(mine, reference, strict=True)) > 0.9999
    assert together[0]["result"]["embeddings"][0] != together[1]["result"]["embeddings"][0]


def test_jobs_that_crash_together_are_not_charged_for_it_and_run_alone_next(processes):
    processes.settings |= {
        "GPUQ_WORKER_SLOTS": "3",
        "GPUQ_WORKER_TTL_S": "2",
        "GPUQ_WORKER_HEARTBEAT_INTERVAL_S": "0.5",
    }
    _api, url = processes.start_api()
    first, _name = processes.start_worker()
    counting = {"kind": "generate", "model": MODEL, "prompt": "Count: 1, 2, 3,", "temperature": 0}
    with processes.client(url) as client:
        jobs = client.submit_many([counting | {"max_tokens": 150}] * 3)
        deadline = time.monotonic() + 60
        while any(client.job(j["id"])["status"] != "running" for j in jobs) and time.monotonic() < deadline:
            time.sleep(0.05)
        first.kill()  # all three go down with their worker
        recovered: list[str] = []
        deadline = time.monotonic() + 30
        while len(recovered) < 3 and time.monotonic() < deadline:
            recovered += reconcile(processes).recovered  # once the dead worker's key expired
            time.sleep(0.5)
        assert sorted(recovered) == sorted(j["id"] for j in jobs)
        assert all(client.job(j["id"])["attempts"] == 0 for j in jobs)  # nobody charged for the crash
        _second, second_name = processes.start_worker()
        done = sorted((client.wait(j["id"], timeout_s=180) for j in jobs), key=lambda j: j["started_at"])

    assert [j["status"] for j in done] == ["succeeded"] * 3
    assert all(j["attempts"] == 1 and j["worker"] == second_name for j in done)
    # Each ran by itself on the new worker, although it has three slots.
    for before, after in itertools.pairwise(done):
        assert _at(before, "finished_at") <= _at(after, "started_at")
