"""Two real models of two architectures, SmolLM2 135M (Llama) and Gemma 3 270M (Gemma 3: a
262,144-token vocabulary and sliding-window layers, so a VRAM estimate from its own GGUF header
nearly three times SmolLM2's), through real workers: placement by each one's estimate, and one
worker swapping between them."""

import time
from pathlib import Path

from tests.e2e.conftest import wait_until

SMOLLM2 = "smollm2-135m"
GEMMA = "gemma3-270m"
ASK = {"kind": "generate", "prompt": "Q: Which city is the capital of France?\nA:", "stop": ["\n"], "temperature": 0}


def register_gemma(client, processes, second_model_path) -> dict:
    (Path(processes.workdir) / "models" / "gemma.gguf").symlink_to(second_model_path)
    return client.register_model({"name": GEMMA, "path": "gemma.gguf", "kinds": ["generate"]})


def run_all(client, jobs, timeout_s=240):
    ids = [j["id"] for j in client.submit_many(jobs)]
    done = [client.wait(i, timeout_s=timeout_s) for i in ids]
    assert all(j["status"] == "succeeded" for j in done), [j["error"] for j in done]
    return done


def test_each_model_lands_only_where_its_own_estimate_fits(processes, second_model_path):
    """A 24 GiB GPU and a 1.5 GiB one: SmolLM2 fits both, Gemma 3 only the first."""
    processes.settings |= {
        "GPUQ_SIMULATED_GPUS": "24,1.5",
        "GPUQ_WORKER_THREADS": "1",
        "GPUQ_WORKER_REFRESH_INTERVAL_S": "1",
    }
    _api, url = processes.start_api()
    processes.start_supervisor(expected_workers=2)
    with processes.client(url) as client:
        gemma = register_gemma(client, processes, second_model_path)
        smollm2 = next(m for m in client.models() if m["id"] == SMOLLM2)
        assert (gemma["architecture"], smollm2["architecture"]) == ("gemma3", "llama")
        assert smollm2["vram_mib"] < 1536 < gemma["vram_mib"] < 24 * 1024, (smollm2["vram_mib"], gemma["vram_mib"])
        gpus = {g["index"]: g["uuid"] for g in client.gpus()}
        time.sleep(2.5)  # workers re-read the models every second here
        jobs = [
            ASK | {"model": model, "max_tokens": 8, "prompt": f"{ASK['prompt']} {i}"}
            for i in range(4)
            for model in (GEMMA, SMOLLM2)
        ]
        done = run_all(client, jobs)
    assert {j["device"] for j in done if j["model"] == GEMMA} == {f"simulated:{gpus[0]}"}
    assert all(j["completion_tokens"] > 0 for j in done)


def test_one_worker_swaps_between_the_two_and_gives_each_its_own_answer(processes, second_model_path):
    """One model loaded at a time (GPUQ_WORKER_MAX_LOADED_MODELS=1): each job of the other
    model unloads the last one (LRU) and loads its own; the same greedy job gives the same
    text after a swap and back."""
    processes.settings |= {"GPUQ_WORKER_MAX_LOADED_MODELS": "1", "GPUQ_WORKER_THREADS": "1"}
    _api, url = processes.start_api()
    processes.start_worker()
    with processes.client(url) as client:
        register_gemma(client, processes, second_model_path)
        answers, loaded = [], []
        for model in (GEMMA, SMOLLM2, GEMMA, SMOLLM2):
            [job] = run_all(client, [ASK | {"model": model, "max_tokens": 16}])
            answers.append((model, job["result"]["text"], job["load_ms"] > 0))
            wait_until(lambda: client.workers()["data"][0]["state"] == "idle", "the worker never went idle")
            loaded.append(client.workers()["data"][0]["loaded_models"])
    assert [a[2] for a in answers] == [True, True, True, True]  # every job after a swap loaded its model
    assert loaded == [[GEMMA], [SMOLLM2], [GEMMA], [SMOLLM2]]
    assert answers[0][1] == answers[2][1] and answers[1][1] == answers[3][1]
    assert answers[0][1] != answers[1][1]  # two models, two answers
    assert "Paris" in answers[0][1]
