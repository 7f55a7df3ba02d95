"""Driving the real decoder from a test: requests admitted as the worker's runs admit them
(``LoadedModel.prepare`` then ``Prepared.admit``), stepped until they end."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from redis import Redis
from sqlalchemy.orm import Session, sessionmaker

from gpuq import store
from gpuq.db.engine import sync_engine, sync_sessions
from worker.catalog import ModelInfo
from worker.decoding import PREFILL_CHUNK_TOKENS, Finished, Generation
from worker.engine import LoadedModel
from worker.model_cache import ModelCache, ModelSpec
from worker.outcome_writer import OutcomeWriter
from worker.runner import JobRunner


def engine_like_llama(model_path: str, *, n_ctx: int = 1024) -> Any:
    """llama-cpp-python's ``Llama`` evaluating as the engine does: a prompt in chunks of the
    engine's size at the same boundaries, every row's logits kept (CPU kernels differ with a
    batch's size, by about 1e-2 in a logit, so another split would not be the same computation)."""
    import llama_cpp

    return llama_cpp.Llama(
        model_path=model_path,
        n_ctx=n_ctx,
        n_batch=PREFILL_CHUNK_TOKENS,
        n_ubatch=PREFILL_CHUNK_TOKENS,
        n_threads=2,
        logits_all=True,
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
    """Admits one request; returns the prompt tokens it took from the cache."""
    return model.prepare(key, request, cancel or threading.Event(), kw.get("deadline")).admit()


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


def run_jobs(runner: JobRunner, job_ids: list[str]) -> None:
    """Claims queued generation jobs and runs them side by side through the runner's calls a
    worker's run makes (batching.py: prepare, admit, admitted, step, finish), to their outcomes."""
    prepared = []
    for job_id in job_ids:
        claimed = runner.claim(job_id)
        if claimed is not None:
            ready = runner.prepare_generation(claimed, threading.Event(), None)
            if ready is not None:
                prepared.append(ready)
    if not prepared:
        return
    decoder = prepared[0].decoder
    for ready in prepared:
        runner.admitted(ready.key, ready.admit(), decoder.tokens_decoded)
    while decoder.active:
        finished = decoder.step()
        runner.publish_pieces(decoder.take_pieces(), ended=bool(finished))
        for done in finished:
            runner.finish_generation(done)
    runner.keep_models()


@contextmanager
def real_runner(database_url: str, redis_url: str, *, slots: int = 2, **options: Any) -> Iterator[RunnerParts]:
    """A runner as worker/main.py wires it: real SQL, Redis, writer, cache and model (the model
    file registered in the test's database, a 512-token context, ``slots`` sequences)."""
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
        return LoadedModel(spec.path, n_ctx=spec.n_ctx, embedding=spec.embedding, threads=2, gpu_layers=0, slots=slots)

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
