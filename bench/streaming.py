"""Streaming overhead: 20 streamed chat requests through gpuq's OpenAI-compatible API (the
official `openai` client, one request after another, as a chat user sends them) against
the same requests streamed directly from llama-cpp-python's `create_chat_completion` in one
process: same model, chat template, threads and greedy tokens.

Two figures: total throughput (completion tokens over the wall time of all 20, so each
request's way in and out through HTTP, SQL, the queue and the token stream counts), and
the time to first token that gpuq adds, per prompt (gpuq's minus direct's), as a median.
Both sides load the model before the clock starts (gpuq with one warm-up request).

The same requests through OpenAI's Responses API (``client.responses.create(stream=True)``)
run on the same gpuq system after chat's, with each prompt evaluated whole (with prompt reuse,
the second API would find each prompt cached by the first): its throughput over chat's and
its first token p50 minus chat's (targets: >= 0.95x, within 10 ms).

Like for like, twice: each prompt evaluated whole on both sides (direct: `Llama.reset()`
before each request; gpuq: GPUQ_WORKER_PROMPT_CACHE=false), and with prompt reuse on both
(direct: llama-cpp-python's own prefix reuse; gpuq: its default), since the chat template's
system prompt is a start every request shares. Flash attention on both sides, gpuq's default.

Beside them, the same prompts streamed through gpuq's Anthropic Messages API (the official
`anthropic` client) on the same kind of system, with prompt reuse: its tokens/s over the
chat completions stream's, and both first-token p50s (target: >= 0.95x, within 10 ms).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

import anthropic
import llama_cpp
import openai

from bench.generation import PROMPTS
from gpuq.registry.bundled import BUNDLED_CONTEXT_LENGTH, BUNDLED_MODEL_NAME, require_bundled_model_path
from gpuq.testing import GpuqProcesses

SEED = 7


@dataclass
class Run:
    texts: list[str] = field(default_factory=list)
    first_token_s: list[float] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def _messages(prompt: str) -> list[Any]:  # each client types its messages its own way
    return [{"role": "user", "content": prompt}]


def run_direct(*, threads: int, max_tokens: int, reuse: bool) -> Run:
    llm = llama_cpp.Llama(
        model_path=str(require_bundled_model_path()),
        n_ctx=BUNDLED_CONTEXT_LENGTH,
        n_threads=threads,
        n_threads_batch=threads,
        flash_attn=True,  # as gpuq's workers have it by default: the same text on both sides
        verbose=False,
    )
    llm.create_chat_completion(messages=_messages("Hi"), max_tokens=1)  # warm up, as gpuq's side does
    run = Run()
    started = time.perf_counter()
    for prompt in PROMPTS:
        if not reuse:
            llm.reset()  # nothing of the last prompt is reused: the whole prompt is evaluated
        asked = time.perf_counter()
        pieces: list[str] = []
        stream = llm.create_chat_completion(
            messages=_messages(prompt), max_tokens=max_tokens, temperature=0.0, seed=SEED, stream=True
        )
        for chunk in stream:
            content = chunk["choices"][0]["delta"].get("content")  # type: ignore[index, union-attr]
            if isinstance(content, str) and content:
                if not pieces:
                    run.first_token_s.append(time.perf_counter() - asked)
                pieces.append(content)
        run.texts.append("".join(pieces))
    run.seconds = time.perf_counter() - started
    llm.close()
    return run


CHAT = "chat"
RESPONSES = "responses"
MESSAGES = "messages"
APIS = (CHAT, RESPONSES, MESSAGES)


def run_gpuq(
    database_url: str, redis_url: str, workdir: Path, *, threads: int, max_tokens: int, reuse: bool
) -> dict[str, Run]:
    """Chat completions' streams, and, without prompt reuse, the Responses API's and Anthropic
    Messages' after them on the same system (each prompt evaluated whole, so the three sides
    do the same work)."""
    # One slot, as the direct side decodes one sequence: this measures the path around it.
    settings = {"GPUQ_WORKER_THREADS": str(threads), "GPUQ_WORKER_SLOTS": "1"}
    settings["GPUQ_WORKER_PROMPT_CACHE"] = "true" if reuse else "false"
    processes = GpuqProcesses(database_url, redis_url, workdir, settings=settings)
    try:
        _api, url = processes.start_api()
        processes.start_worker()
        with openai.OpenAI(base_url=f"{url}/v1", api_key=processes.admin_key, max_retries=0) as client:
            client.chat.completions.create(model=BUNDLED_MODEL_NAME, messages=_messages("Hi"), max_tokens=1)  # loads it
            runs = {CHAT: _stream_all(client, max_tokens)}
            if not reuse:
                runs[RESPONSES] = _stream_responses(client, max_tokens)
                with anthropic.Anthropic(base_url=url, api_key=processes.admin_key, max_retries=0) as claude:
                    runs[MESSAGES] = _stream_all_messages(claude, max_tokens)
            return runs
    finally:
        processes.stop_all()


def _stream_all(client: openai.OpenAI, max_tokens: int) -> Run:
    run = Run()
    started = time.perf_counter()
    for prompt in PROMPTS:
        asked = time.perf_counter()
        pieces: list[str] = []
        stream = client.chat.completions.create(
            model=BUNDLED_MODEL_NAME,
            messages=_messages(prompt),
            max_tokens=max_tokens,
            temperature=0.0,
            seed=SEED,
            stream=True,
            stream_options={"include_usage": True},
        )
        for chunk in stream:
            if chunk.usage is not None:
                run.tokens += chunk.usage.completion_tokens
            if chunk.choices and chunk.choices[0].delta.content:
                if not pieces:
                    run.first_token_s.append(time.perf_counter() - asked)
                pieces.append(chunk.choices[0].delta.content)
        run.texts.append("".join(pieces))
    run.seconds = time.perf_counter() - started
    return run


def _stream_responses(client: openai.OpenAI, max_tokens: int) -> Run:
    run = Run()
    started = time.perf_counter()
    for prompt in PROMPTS:
        asked = time.perf_counter()
        pieces: list[str] = []
        stream = client.responses.create(
            model=BUNDLED_MODEL_NAME,
            input=prompt,
            max_output_tokens=max_tokens,
            temperature=0.0,
            extra_body={"seed": SEED},
            stream=True,
        )
        for event in stream:
            if event.type == "response.output_text.delta" and event.delta:
                if not pieces:
                    run.first_token_s.append(time.perf_counter() - asked)
                pieces.append(event.delta)
            elif event.type in ("response.completed", "response.incomplete") and event.response.usage is not None:
                run.tokens += event.response.usage.output_tokens
        run.texts.append("".join(pieces))
    run.seconds = time.perf_counter() - started
    return run


def _stream_all_messages(client: anthropic.Anthropic, max_tokens: int) -> Run:
    run = Run()
    started = time.perf_counter()
    for prompt in PROMPTS:
        asked = time.perf_counter()
        pieces: list[str] = []
        with client.messages.stream(
            model=BUNDLED_MODEL_NAME,
            messages=_messages(prompt),
            max_tokens=max_tokens,
            extra_body={"temperature": 0.0},  # greedy, as the other sides (the SDK no longer types it)
        ) as stream:
            for text in stream.text_stream:
                if text:
                    if not pieces:
                        run.first_token_s.append(time.perf_counter() - asked)
                    pieces.append(text)
            run.tokens += stream.get_final_message().usage.output_tokens
        run.texts.append("".join(pieces))
    run.seconds = time.perf_counter() - started
    return run


def report_apis(chat: list[Run], others: dict[str, list[Run]]) -> str:
    """The Responses API's and Anthropic Messages' streams against chat completions' on the same systems."""
    chat_ttft = median(s * 1000 for c in chat for s in c.first_token_s)
    lines = [
        "  each API against chat completions, each prompt evaluated whole, same system:",
        f"    /v1/chat/completions  {median(c.tokens_per_s for c in chat):6.1f} tok/s   first token p50 "
        f"{chat_ttft:6.1f} ms   runs: {_runs(chat)}",
    ]
    for path, runs in others.items():
        for c, r in zip(chat, runs, strict=True):
            assert c.texts == r.texts, f"{path} must stream the same greedy text as chat completions"
        ratio = median(r.tokens_per_s for r in runs) / median(c.tokens_per_s for c in chat)
        ttft = median(s * 1000 for r in runs for s in r.first_token_s)
        lines.append(
            f"    {path:<21} {median(r.tokens_per_s for r in runs):6.1f} tok/s   first token p50 {ttft:6.1f} ms   "
            f"runs: {_runs(runs)}   throughput {ratio:.3f}x chat's (target >= 0.95x); first token p50 "
            f"{ttft - chat_ttft:+.1f} ms (target within 10 ms)"
        )
    return "\n".join(lines)


def _pair(direct: list[Run], ours: list[Run]) -> tuple[float, list[float], float, float]:
    """(throughput ratio, first-token ms added per request, direct's and gpuq's first-token p50)."""
    for d, g in zip(direct, ours, strict=True):
        assert d.texts == g.texts, "both sides must stream the same greedy text"
        d.tokens = g.tokens  # the same text is the same tokens; gpuq's usage counts them exactly
    ratio = median(g.tokens_per_s for g in ours) / median(d.tokens_per_s for d in direct)
    added = sorted(
        (g_s - d_s) * 1000
        for d, g in zip(direct, ours, strict=True)
        for d_s, g_s in zip(d.first_token_s, g.first_token_s, strict=True)
    )
    direct_ttft = median(s * 1000 for d in direct for s in d.first_token_s)
    ours_ttft = median(s * 1000 for g in ours for s in g.first_token_s)
    return ratio, added, direct_ttft, ours_ttft


def _runs(runs: list[Run]) -> str:
    return ", ".join(f"{r.tokens_per_s:.1f}" for r in runs)


def report(runs: dict[str, tuple[list[Run], list[Run]]], *, threads: int, max_tokens: int) -> str:
    """``runs``: per comparison, (direct runs, gpuq runs); the first one gives the last line."""
    rounds = len(next(iter(runs.values()))[0])
    lines = [
        f"\nstreaming: {len(PROMPTS)} streamed chat requests one after another, max_tokens {max_tokens}, greedy, "
        f"{threads} threads, median of {rounds} rounds"
    ]
    summary = ""
    for name, (direct, ours) in runs.items():
        ratio, added, direct_ttft, ours_ttft = _pair(direct, ours)
        p95 = added[min(len(added) - 1, int(0.95 * len(added)))]
        lines += [
            f"  {name}: {ours[0].tokens} tokens a round",
            f"    llama-cpp-python create_chat_completion(stream=True)  {median(d.tokens_per_s for d in direct):6.1f} "
            f"tok/s   first token p50 {direct_ttft:6.1f} ms   runs: {_runs(direct)}",
            f"    gpuq /v1/chat/completions, openai client, SSE         {median(g.tokens_per_s for g in ours):6.1f} "
            f"tok/s   first token p50 {ours_ttft:6.1f} ms   runs: {_runs(ours)}",
            f"    first token added by gpuq, per request: p50 {median(added):.1f} ms, p95 {p95:.1f} ms "
            f"(target p50 < 50 ms); throughput {ratio:.3f}x (target >= 0.95x)",
        ]
        summary = summary or f"streaming: throughput {ratio:.2f}x, first-token overhead p50 {median(added):.0f} ms"
    return "\n".join([*lines, summary])
