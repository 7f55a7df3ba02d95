"""Continuous batching: 64 generation jobs through gpuq with K slots per worker, against
the same prompts decoded directly with llama-cpp-python.

Three sides, same prompts, same model, same threads, greedy:

* **sequential**: ``Llama.create_completion`` one prompt after another (what a gpuq worker
  did before continuous batching);
* **direct batched** (the ceiling at K): a minimal loop on llama-cpp-python's low-level API,
  no queue, no HTTP, no SQL: one context with K sequences, each step one ``llama_decode``
  with the next token of every live sequence and the prompts of sequences that just joined,
  greedy sampling, a new prompt joining as soon as one ends (flash attention on, as gpuq's
  workers have it by default);
* **gpuq at K**: the jobs submitted over HTTP at once to one worker with
  ``GPUQ_WORKER_SLOTS=K``; the clock runs from the submission to the last recorded finish;
* **gpuq at K=1 with prompt reuse off** (``GPUQ_WORKER_PROMPT_CACHE=false``): these ~30-token
  prompts share no whole 64-token chunk, so reuse (on by default) should change nothing here;
  ``create_completion`` reuses the shared first words of the previous prompt token by token.

Aggregate tokens/s, and p50/p95 job latency (submission to finish; for the direct sides,
from the start of the run to the sequence's end, as if all were submitted at once).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from statistics import quantiles

import llama_cpp

from bench.generation import run_through_gpuq
from gpuq.registry.bundled import BUNDLED_CONTEXT_LENGTH, BUNDLED_MODEL_NAME, require_bundled_model_path

SUBJECTS = [
    "the sea", "mountains", "a city at night", "bread", "rain", "a library", "trains", "the moon",
    "autumn", "a garden", "bicycles", "the desert", "music", "a market", "snow", "bridges",
]  # fmt: skip
STYLES = ["a poet", "a child", "a scientist", "a travel guide"]
# 64 prompts of about 30 tokens each.
PROMPTS = [
    f"You are {style}. In a few plain sentences, describe {subject} to someone who has never seen it. Begin:"
    for style in STYLES
    for subject in SUBJECTS
]


@dataclass
class Run:
    completion_tokens: int
    seconds: float
    latencies_s: list[float] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.seconds

    def latency(self, pct: int) -> float:
        return quantiles(self.latencies_s, n=100, method="inclusive")[pct - 1]


def run_sequential(*, threads: int, max_tokens: int, gpu_layers: int = 0) -> Run:
    llm = llama_cpp.Llama(
        model_path=str(require_bundled_model_path()),
        n_ctx=BUNDLED_CONTEXT_LENGTH,
        n_threads=threads,
        n_threads_batch=threads,
        n_gpu_layers=gpu_layers,
        flash_attn=True,  # as gpuq's workers have it by default
        verbose=False,
    )
    tokens, latencies = 0, []
    started = time.perf_counter()
    for prompt in PROMPTS:
        out = llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0, top_p=1.0, seed=7)
        assert isinstance(out, dict)  # not streamed
        tokens += out["usage"]["completion_tokens"]
        latencies.append(time.perf_counter() - started)
    elapsed = time.perf_counter() - started
    llm.close()
    return Run(tokens, elapsed, latencies)


class _Direct:
    """The ceiling's llama.cpp objects, made and freed with the low-level API."""

    def __init__(self, *, slots: int, threads: int, gpu_layers: int) -> None:
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = gpu_layers
        self.model = llama_cpp.llama_model_load_from_file(str(require_bundled_model_path()).encode(), mparams)
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = BUNDLED_CONTEXT_LENGTH * slots, 512, 512
        cparams.n_seq_max, cparams.kv_unified = slots, False
        cparams.n_threads = cparams.n_threads_batch = threads
        cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO  # as gpuq's workers have it by default
        self.ctx = llama_cpp.llama_init_from_model(self.model, cparams)
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(512, 0, 1)
        self.sampler = llama_cpp.llama_sampler_init_greedy()

    def tokenize(self, text: str) -> list[int]:
        data = text.encode()
        buf = (llama_cpp.llama_token * (len(data) + 8))()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, len(buf), True, True)
        return list(buf[:n])

    def put(self, i: int, token: int, pos: int, seq: int, logits: bool) -> None:
        b = self.batch
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, logits
        b.seq_id[i][0] = seq

    def fill(self, live: dict[int, _Live]) -> None:
        """One step's batch: the next token of each generating sequence, new prompts whole (they
        are short), in slot order (llama.cpp puts only consecutive sequence ids in one micro-batch)."""
        n = 0
        for slot, s in sorted(live.items()):
            if s.fed:
                self.put(n, s.last, len(s.prompt) + s.generated - 1, slot, True)
                s.logits_at, n = n, n + 1
            else:
                for pos, token in enumerate(s.prompt):
                    self.put(n + pos, token, pos, slot, pos == len(s.prompt) - 1)
                s.fed, n = True, n + len(s.prompt)
                s.logits_at = n - 1
        self.batch.n_tokens = n

    def close(self) -> None:
        llama_cpp.llama_sampler_free(self.sampler)
        llama_cpp.llama_batch_free(self.batch)
        llama_cpp.llama_free(self.ctx)
        llama_cpp.llama_model_free(self.model)


@dataclass
class _Live:
    prompt: list[int]
    fed: bool = False
    generated: int = 0
    last: int = -1  # the token sampled last
    logits_at: int = -1  # its row in this step's batch


def run_direct_batched(*, slots: int, threads: int, max_tokens: int, gpu_layers: int = 0) -> Run:
    """The ceiling: continuous batching with nothing around it (see the module's docstring)."""
    d = _Direct(slots=slots, threads=threads, gpu_layers=gpu_layers)
    pending = [d.tokenize(p) for p in PROMPTS]
    live: dict[int, _Live] = {}
    tokens, latencies = 0, []
    started = time.perf_counter()
    while pending or live:
        for slot in range(slots):
            if slot not in live and pending:
                live[slot] = _Live(pending.pop(0))
        d.fill(live)
        if llama_cpp.llama_decode(d.ctx, d.batch) != 0:
            raise RuntimeError("llama_decode failed")
        for slot, s in list(live.items()):
            token = llama_cpp.llama_sampler_sample(d.sampler, d.ctx, s.logits_at)
            ended = llama_cpp.llama_vocab_is_eog(d.vocab, token)
            if not ended:
                s.generated, s.last, tokens = s.generated + 1, token, tokens + 1
                ended = s.generated == max_tokens
            if ended:
                llama_cpp.llama_memory_seq_rm(d.memory, slot, -1, -1)
                latencies.append(time.perf_counter() - started)
                del live[slot]
    elapsed = time.perf_counter() - started
    d.close()
    return Run(tokens, elapsed, latencies)


def run_gpuq(
    database_url: str,
    redis_url: str,
    workdir: Path,
    *,
    slots: int,
    threads: int,
    max_tokens: int,
    gpus: str | None = None,
    prompt_cache: bool = True,
) -> Run:
    body = {"kind": "generate", "model": BUNDLED_MODEL_NAME, "max_tokens": max_tokens, "temperature": 0.0}
    jobs = [body | {"prompt": p, "top_p": 1.0, "seed": 7} for p in PROMPTS]
    settings = {
        "GPUQ_WORKER_THREADS": str(threads),
        "GPUQ_WORKER_SLOTS": str(slots),
        "GPUQ_WORKER_PROMPT_CACHE": "true" if prompt_cache else "false",
    }
    started, done = run_through_gpuq(database_url, redis_url, workdir, jobs, settings=settings, gpus=gpus)
    finished = [datetime.fromisoformat(j["finished_at"]) for j in done]
    # The clock stops when the worker recorded the last job finished, not when we looked.
    elapsed = (max(finished) - started).total_seconds()
    submitted = [datetime.fromisoformat(j["created_at"]) for j in done]
    latencies = [(f - s).total_seconds() for f, s in zip(finished, submitted, strict=True)]
    return Run(sum(j["completion_tokens"] for j in done), elapsed, latencies)
