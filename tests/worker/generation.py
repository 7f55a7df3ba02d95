"""Driving the real decoder from a test: requests admitted as the worker's runs admit them
(``LoadedModel.prepare`` then ``Prepared.admit``), stepped until they end."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from worker.decoding import Finished, Generation
from worker.engine import LoadedModel
from worker.runner import JobRunner


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
