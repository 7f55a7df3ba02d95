"""Driving the real decoder from a test: requests admitted as the worker's runs admit them
(``LoadedModel.prepare`` then ``Prepared.admit``), stepped until they end."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
from redis import Redis
from sqlalchemy.orm import Session, sessionmaker

from gpuq import store
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.jobs.generation_params import GenerationParams
from gpuq.queue_names import parse_queue_name
from worker.batching import GenerationRun, Started
from worker.catalog import ModelInfo
from worker.decoding import FLASH_ATTN_CHUNK_TOKENS, PREFILL_CHUNK_TOKENS, Finished, Generation
from worker.engine import LoadedModel
from worker.model_cache import ModelCache, ModelSpec
from worker.outcome_writer import OutcomeWriter
from worker.runner import JobRunner

MODEL = "smollm2-135m"  # the bundled model, as tests/conftest.py registers it
# llama.cpp's threads spin at every barrier of a step: on a 2-core machine shared with the test
# process itself (and, often, another run), two threads mostly wait for each other. Measured on
# the bundled model: 0.4 s of CPU for a 32-token generation with one thread, 3 s with two, the
# same text (each output row is computed by one thread, so the count does not change a logit).
THREADS = 1


def engine_like_llama(model_path: str, *, n_ctx: int = 1024, logits_all: bool = True, flash_attn: bool = True) -> Any:
    """llama-cpp-python's ``Llama`` evaluating as the engine does on the CPU: flash attention as
    the engine has it (on by default, ``Llama``'s own default is off), a prompt in passes of the
    engine's size at the same boundaries (CPU kernels differ with a pass's size, by about 1e-2 in
    a logit, so another split would not be the same computation), every row's logits kept or,
    as a plain generation has it, the last one only. Below 512 KV cells a stream's lone decode
    row is computed as the engine computes it beside others (docs/architecture.md), so its texts
    are the engine's texts token for token."""
    import llama_cpp

    chunk = FLASH_ATTN_CHUNK_TOKENS if flash_attn else PREFILL_CHUNK_TOKENS
    return llama_cpp.Llama(
        model_path=model_path,
        n_ctx=n_ctx,
        n_batch=chunk,
        n_ubatch=chunk,
        n_threads=THREADS,
        logits_all=logits_all,
        flash_attn=flash_attn,
        verbose=False,
    )


def direct_logprobs(llm: Any, prompt: list[int], completion: tuple[int, ...] = ()) -> np.ndarray:
    """Row i: the log-softmax, in float64, of the logits after (prompt + completion)[: i + 1];
    the prompt evaluated in one call (chunked by the engine's size), then a token at a time."""
    llm.reset()
    llm.eval(prompt)
    for token in completion:
        llm.eval([token])
    scores = np.array(llm.scores[: len(prompt) + len(completion)], dtype=np.float64)
    scores -= scores.max(axis=1, keepdims=True)
    return scores - np.log(np.exp(scores).sum(axis=1, keepdims=True))


def admit(
    model: LoadedModel, key: str, request: dict[str, Any], cancel: threading.Event | None = None, **kw: Any
) -> int:
    """Admits one request (at ``priority``, normal unless given); returns the prompt tokens it
    took from the cache."""
    params = GenerationParams.model_validate(request)
    prepared = model.prepare(
        key, params, cancel or threading.Event(), kw.get("deadline"), priority=kw.get("priority", 1)
    )
    return prepared.admit()


def run_together(
    model: LoadedModel,
    requests: dict[str, dict[str, Any]],
    cancels: dict[str, threading.Event] | None = None,
    after_step: Callable[[int], object] = lambda _step: None,
) -> dict[str, Finished]:
    """Admits every request as soon as slots are free (more requests than slots: slots are
    reused) and steps until all ended; returns each key's Finished."""
    decoder = model.decoder
    assert decoder is not None
    pending = list(requests.items())
    done: dict[str, Finished] = {}
    step = 0
    while pending or decoder.active:
        while pending and decoder.free_slots >= (pending[0][1].get("n") or 1):
            key, request = pending.pop(0)
            admit(model, key, request, (cancels or {}).get(key))
        for finished in decoder.step():
            done[finished.key] = finished
        step += 1
        after_step(step)
    return done


def generate(model: LoadedModel, request: dict[str, Any], cancel: threading.Event | None = None) -> Generation:
    """One request alone, start to end."""
    finished = run_together(model, {"alone": request}, {"alone": cancel or threading.Event()})["alone"]
    assert finished.generation is not None, finished.error
    return finished.generation


@dataclass(frozen=True)
class ListedJob:
    """What a run reads of RQ's job: its id (the job row's)."""

    id: str


@dataclass(frozen=True)
class ListedQueue:
    """What a run reads of RQ's queue: its name."""

    name: str = f"gpuq:{MODEL}:generate:normal"


@dataclass
class ListHost:
    """A worker for ``GenerationRun`` whose queue is a list of job ids, in order: claims go to
    SQL through the real runner as RQ's worker makes them; records which threads call it and
    what it started, ended and put back."""

    runner: JobRunner
    waiting: list[str]
    job_timeout_s: float = 600.0
    preemption: bool = True
    alone: set[str] = field(default_factory=set)
    stop_after: int | None = None  # may_take_more turns False once this many jobs started
    started: list[str] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)
    put_back_ids: list[str] = field(default_factory=list)
    threads: set[str] = field(default_factory=set)
    calls: list[tuple[str, str]] = field(default_factory=list)  # ("start" or "end", job id), in order

    def _called(self) -> None:
        self.threads.add(threading.current_thread().name)

    def may_take_more(self) -> bool:
        self._called()
        return self.stop_after is None or len(self.started) < self.stop_after

    def next_waiting(self, model: str, kind: str) -> tuple[Any, Any] | None:
        self._called()
        return (ListedJob(self.waiting.pop(0)), ListedQueue()) if self.waiting else None

    def waiting_priority(self, model: str, kind: str) -> int | None:
        self._called()
        return parse_queue_name(ListedQueue().name)[2] if self.waiting else None

    def put_back(self, job: Any, queue: Any) -> None:
        self._called()
        self.put_back_ids.append(job.id)

    def must_run_alone(self, job: Any) -> bool:
        self._called()
        return job.id in self.alone

    def start(self, job: Any, queue: Any) -> Started | None:
        self._called()
        claimed = self.runner.claim(job.id)
        if claimed is None:
            return None
        self.started.append(job.id)
        self.calls.append(("start", job.id))
        return Started(job, queue, cast(Any, None), threading.Event(), claimed)

    def end(self, job: Any, execution: Any) -> None:
        self._called()
        self.ended.append(job.id)
        self.calls.append(("end", job.id))

    def fail(self, job: Any, queue: Any, execution: Any) -> None:
        self._called()


def run_listed(host: ListHost, first: str) -> None:
    """One generation run, as the worker starts it for the job RQ handed it (``first``); the
    run takes the host's waiting jobs while it has free slots."""
    GenerationRun(host, cast(Any, ListedQueue()), MODEL, "generate").run(cast(Any, ListedJob(first)))


def run_jobs(runner: JobRunner, job_ids: list[str]) -> ListHost:
    """Queued generation jobs run to their outcomes the way production runs them: the first
    starts a generation run (batching.py: the desk claims and prepares, the engine admits and
    steps), which takes the others while it has free slots."""
    host = ListHost(runner, list(job_ids[1:]))
    run_listed(host, job_ids[0])
    return host


@contextmanager
def real_runner(
    database_url: str, redis_url: str, *, slots: int = 2, prompt_cache: bool = True, **options: Any
) -> Iterator[RunnerParts]:
    """A runner as worker/main.py wires it: real SQL, Redis, writer, cache and model (the model
    file registered in the test's database, a 512-token context, ``slots`` sequences, prompts
    reused from the KV cache unless ``prompt_cache`` is False)."""
    engine = sync_engine(database_url)
    sessions = sync_sessions(engine)
    redis = Redis.from_url(redis_url)
    writer = OutcomeWriter(sessions, redis=redis)
    writer.start()

    def models(name: str) -> ModelInfo:
        with sessions() as s:
            m = store.get_model(s, name)
        assert m is not None
        return ModelInfo(m.name, m.path, 512, m.vram_mib)

    def load(spec: ModelSpec) -> LoadedModel:
        return LoadedModel(
            spec.path,
            n_ctx=spec.n_ctx,
            embedding=spec.embedding,
            threads=THREADS,
            gpu_layers=0,
            slots=slots,
            prompt_cache=prompt_cache,
        )

    on_load = options.pop("on_load", None)
    runner = JobRunner(
        sessions=sessions,
        models=models,
        cache=ModelCache(load, max_loaded=2, on_load=on_load),
        writer=writer,
        worker_name=options.pop("worker_name", "w1"),
        device=options.pop("device", "cpu"),
        **options,
    )
    try:
        yield RunnerParts(runner, writer, sessions, redis)
    finally:
        writer.stop()
        redis.close()
        engine.dispose()


@dataclass(frozen=True)
class RunnerParts:
    runner: JobRunner
    writer: OutcomeWriter
    sessions: sessionmaker[Session]
    redis: Redis
