"""`n` samples above the slots of every live worker serving the model are refused when they
are submitted (OpenAI's routes, gpuq's jobs API, a batch's line), with nothing stored or
queued; a worker used to take such a job and fail it after its claim. Real processes: the
API, and workers with slots of their own serving one model each."""

import json
from pathlib import Path

import openai
import pytest
from redis import Redis

from gpuq.cli.client import ApiError
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import Job
from gpuq.fleet.workers import live_workers
from tests.e2e.conftest import wait_until

MODEL = "smollm2-135m"
TWIN = "smollm2-twin"  # the same file registered again, served by another worker
QUESTION = [{"role": "user", "content": "Name a colour."}]


def _nothing_stored_or_queued(processes, redis: Redis) -> None:
    engine = sync_engine(processes.database_url)
    with sync_sessions(engine)() as session:
        assert session.query(Job).count() == 0
    engine.dispose()
    assert redis.keys("rq:job:*") == [] and redis.keys("rq:queue:gpuq:*") == []


def _batch_file(tmp_path: Path, client: openai.OpenAI, n: int):
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 2, "n": n}
    path = tmp_path / "lines.jsonl"
    path.write_text(json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": body}))
    with path.open("rb") as f:
        return client.files.create(file=f, purpose="batch")


def test_more_samples_than_a_serving_workers_slots_are_refused_at_submit(processes, model_path, tmp_path):
    _api, url = processes.start_api()  # GPUQ_WORKER_SLOTS unset: a worker on this GPU-less fleet gets 4
    redis = Redis.from_url(processes.redis_url)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=processes.admin_key, max_retries=0)
    with processes.client(url) as gpuq:
        # No worker is live: the slots the workers that start will have.
        with pytest.raises(openai.BadRequestError, match="no worker serving 'smollm2-135m' is live") as none_live:
            client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2, n=5)
        assert none_live.value.param == "n" and "at most 4 samples" in str(none_live.value)
        _nothing_stored_or_queued(processes, redis)

        (Path(processes.workdir) / "models" / "twin.gguf").symlink_to(model_path)
        gpuq.register_model({"name": TWIN, "path": "twin.gguf", "kinds": ["generate"]})
        processes.settings["GPUQ_WORKER_SLOTS"] = "2"
        processes.start_worker(models=(MODEL,))
        processes.settings["GPUQ_WORKER_SLOTS"] = "4"
        processes.start_worker(models=(TWIN,))
        wait_until(
            lambda: (
                sorted((w.slots, tuple(sorted(w.generates or ()))) for w in live_workers(redis))
                == [(2, (MODEL,)), (4, (TWIN,))]
            ),
            "both workers to publish their slots and models",
        )

        # The 4-slot worker serves only the twin: smollm2's limit is its own worker's 2.
        with pytest.raises(openai.BadRequestError, match="decode at most 2 at once") as chat:
            client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2, n=3)
        assert (chat.value.param, chat.value.type) == ("n", "invalid_request_error")
        with pytest.raises(openai.BadRequestError, match="at most 2 samples"):
            client.completions.create(model=MODEL, prompt="Colours:", max_tokens=2, n=3)
        with pytest.raises(ApiError, match="at most 2 samples") as job:
            gpuq.submit({"kind": "generate", "model": MODEL, "prompt": "Colours:", "max_tokens": 2, "n": 3})
        assert job.value.status == 422
        with pytest.raises(openai.UnprocessableEntityError, match="line 1: n is 3"):
            client.batches.create(
                input_file_id=_batch_file(tmp_path, client, 3).id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
            )
        _nothing_stored_or_queued(processes, redis)

        # What some serving worker has slots for runs.
        two = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2, n=2, temperature=1.0)
        assert [c.index for c in two.choices] == [0, 1]
        three = gpuq.submit({"kind": "generate", "model": TWIN, "prompt": "Colours:", "max_tokens": 2, "n": 3})
        done = gpuq.wait(three["id"], timeout_s=240)
        assert done["status"] == "succeeded", done["error"]
        assert len(done["result"]["choices"]) == 3
    client.close()
    redis.close()
