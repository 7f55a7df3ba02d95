"""What a streaming drop-in client reads when its job ends badly or restarts mid-answer: the
same rule and the same words in OpenAI's server-sent events and Ollama's NDJSON lines."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

from gpuq.db.tables import Job, utcnow
from gpuq.dropin import ollama, openai
from gpuq.streams.events import Delta, End, Event, Start

JOB_ID = "job_0123"
RESTARTED = (
    f"the worker running job {JOB_ID} stopped; the job is running again (attempt 2) "
    f"and its text so far cannot be taken back: read GET /v1/jobs/{JOB_ID}"
)


async def _events(*events: Event) -> AsyncIterator[Event]:
    for event in events:
        yield event


async def _openai(*events: Event) -> list[dict]:
    job = Job(id=JOB_ID, model="smollm2-135m", request={}, created_at=utcnow())
    chunks = [c async for c in openai.stream(_events(*events), "/v1/completions", job, include_usage=False)]
    lines = [c.decode().removeprefix("data: ").strip() for c in chunks]
    return [json.loads(line) for line in lines if line != "[DONE]"]


async def _ollama(*events: Event) -> list[dict]:
    lines = [
        json.loads(line)
        async for line in ollama.stream(_events(*events), JOB_ID, "smollm2-135m", time.perf_counter(), chat=False)
    ]
    return lines


def _openai_text(chunks: list[dict]) -> str:
    return "".join(choice["text"] for chunk in chunks for choice in chunk.get("choices", []))


def _ollama_text(lines: list[dict]) -> str:
    return "".join(line.get("response", "") for line in lines)


async def test_a_restart_after_text_was_sent_ends_the_answer_in_both_formats_with_the_same_words():
    events = (Start(1), Delta("One, two", 2), Start(2), Delta("One", 1), End("succeeded", "stop"))
    openai_chunks, ollama_lines = await _openai(*events), await _ollama(*events)
    assert _openai_text(openai_chunks) == _ollama_text(ollama_lines) == "One, two"  # nothing of the new run
    assert (openai_chunks[-1]["error"]["message"], openai_chunks[-1]["error"]["code"]) == (RESTARTED, "job_restarted")
    assert ollama_lines[-1] == {"error": RESTARTED}


async def test_a_restart_before_any_text_was_sent_gives_the_new_runs_answer():
    events = (Start(1), Start(2), Delta("One, two", 2), End("succeeded", "stop", completion_tokens=2))
    openai_chunks, ollama_lines = await _openai(*events), await _ollama(*events)
    assert _openai_text(openai_chunks) == _ollama_text(ollama_lines) == "One, two"
    assert openai_chunks[-1]["choices"][0]["finish_reason"] == "stop" and "error" not in openai_chunks[-1]
    assert ollama_lines[-1]["done"] is True and "error" not in ollama_lines[-1]


async def test_a_cancelled_or_failed_job_ends_both_formats_with_the_same_error():
    for end, said in (
        (End("cancelled", "cancelled"), f"job {JOB_ID} was cancelled"),
        (
            End("cancelled", "cancelled", error="gpuq is shutting down"),
            f"job {JOB_ID} was cancelled: gpuq is shutting down",
        ),
        (End("failed", error="RuntimeError: boom"), f"job {JOB_ID} failed: RuntimeError: boom"),
    ):
        openai_chunks = await _openai(Start(1), Delta("One", 1), end)
        ollama_lines = await _ollama(Start(1), Delta("One", 1), end)
        assert openai_chunks[-1]["error"]["message"] == ollama_lines[-1]["error"] == said
