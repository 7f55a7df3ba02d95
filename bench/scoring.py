"""Scoring multiple-choice items by loglikelihood: gpuq's ``echo`` + ``logprobs`` against a
direct llama-cpp-python loop, same model, same threads, same tokens.

200 items of 4 choices each (800 requests, as an eval harness sends them: the context and one
choice, scored by the log-probabilities of the choice's tokens). The direct loop evaluates each
request's tokens with ``Llama.eval`` (``logits_all``) and sums the choice's log-softmax;
gpuq gets the 800 as one bulk submission of ``echo`` jobs (``max_tokens`` 1, ``logprobs`` 0)
to one worker with its CPU default of 4 slots. Both sides' item choices must agree.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import llama_cpp
import numpy as np

from bench.generation import run_through_gpuq
from gpuq.registry.bundled import BUNDLED_CONTEXT_LENGTH, BUNDLED_MODEL_NAME, require_bundled_model_path
from worker.decoding import FLASH_ATTN_CHUNK_TOKENS

_SUBJECTS = ["a cat", "the sun", "a river", "bread", "a violin", "winter", "a hammer", "the moon", "a forest", "tea"]
_FACTS = ["is usually found", "is best described as", "is mostly made of", "is often used for"]
_CHOICES = ["something warm", "something cold", "a kind of food", "a sound"]
ITEMS = [(f"Question {i}: {_SUBJECTS[i % 10]} {_FACTS[(i // 10) % 4]} what?\nAnswer:", _CHOICES) for i in range(200)]


@dataclass(frozen=True)
class Scored:
    picks: list[int]  # each item's best choice
    seconds: float

    @property
    def items_per_s(self) -> float:
        return len(self.picks) / self.seconds


def _requests(tokenize: Callable[[str], list[int]]) -> list[tuple[list[int], int]]:
    """(tokens, context length) of each item's choices, in order."""
    out = []
    for context, choices in ITEMS:
        context_ids = tokenize(context)
        for choice in choices:
            out.append((tokenize(context + " " + choice), len(context_ids)))
    return out


def _picks(scores: list[float]) -> list[int]:
    return [int(np.argmax(scores[i : i + 4])) for i in range(0, len(scores), 4)]


def run_direct(*, threads: int) -> Scored:
    llm = llama_cpp.Llama(
        model_path=str(require_bundled_model_path()),
        n_ctx=BUNDLED_CONTEXT_LENGTH,
        n_batch=FLASH_ATTN_CHUNK_TOKENS,  # passes as gpuq's engine makes them, flash attention on
        n_ubatch=FLASH_ATTN_CHUNK_TOKENS,
        n_threads=threads,
        n_threads_batch=threads,
        logits_all=True,
        flash_attn=True,
        verbose=False,
    )
    requests = _requests(lambda text: llm.tokenize(text.encode(), add_bos=True, special=True))
    started = time.perf_counter()
    scores = []
    for tokens, context in requests:
        llm.reset()
        llm.eval(tokens)
        rows = np.array(llm.scores[context - 1 : len(tokens) - 1], dtype=np.float64)
        rows -= rows.max(axis=1, keepdims=True)
        logp = rows - np.log(np.exp(rows).sum(axis=1, keepdims=True))
        scores.append(float(sum(logp[i][t] for i, t in enumerate(tokens[context:]))))
    elapsed = time.perf_counter() - started
    llm.close()
    return Scored(_picks(scores), elapsed)


def run_gpuq(database_url: str, redis_url: str, workdir: Path, *, threads: int) -> Scored:
    llm = llama_cpp.Llama(model_path=str(require_bundled_model_path()), vocab_only=True, verbose=False)
    requests = _requests(lambda text: llm.tokenize(text.encode(), add_bos=True, special=True))
    llm.close()
    body = {"kind": "generate", "model": BUNDLED_MODEL_NAME, "max_tokens": 1, "temperature": 0.0}
    texts = [context + " " + choice for context, choices in ITEMS for choice in choices]
    jobs = [body | {"prompt": text, "logprobs": 0, "echo": True} for text in texts]
    settings = {"GPUQ_WORKER_THREADS": str(threads)}
    started, done = run_through_gpuq(database_url, redis_url, workdir, jobs, settings=settings)
    elapsed = (max(datetime.fromisoformat(j["finished_at"]) for j in done) - started).total_seconds()
    scores = []
    for job, (tokens, context) in zip(done, requests, strict=True):
        entries = job["result"]["prompt_logprobs"]
        assert [e["id"] for e in entries] == tokens, "gpuq must score the same tokens"
        scores.append(sum(e["logprob"] for e in entries[context:]))
    return Scored(_picks(scores), elapsed)
