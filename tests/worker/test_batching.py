"""A generation run through its Host interface: a host that serves jobs from a list stands for
RQ's worker (which the e2e tests run for real); SQL, the runner, the writer and the model are
real. What a run promises: every waiting job of its model is taken while slots are free and
settled once; it takes nothing when told to stop or when a job must run alone; and the engine
thread never calls its host (claims, Redis and settling all happen on the desk)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest

from gpuq import store
from tests.gpuq.store.test_store import make_job
from tests.worker.generation import real_runner
from worker.batching import GenerationRun, Started
from worker.runner import JobRunner

MODEL = "smollm2-135m"
GEN = {"prompt": "Count: one, two,", "max_tokens": 8, "temperature": 0.0, "top_p": 1.0, "seed": 1, "stop": []}


@dataclass
class _Job:
    id: str


@dataclass
class _Queue:
    name: str = f"gpuq:{MODEL}:generate:normal"


@dataclass
class ListHost:
    """Jobs waiting in one list, in order; records which thread calls it and what it did."""

    runner: JobRunner
    waiting: list[str]
    job_timeout_s: float = 600.0
    alone: set[str] = field(default_factory=set)
    stop_after: int | None = None  # may_take_more turns False once this many jobs started
    started: list[str] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)
    put_back_ids: list[str] = field(default_factory=list)
    threads: set[str] = field(default_factory=set)

    def _called(self) -> None:
        self.threads.add(threading.current_thread().name)

    def may_take_more(self) -> bool:
        self._called()
        return self.stop_after is None or len(self.started) < self.stop_after

    def next_waiting(self, model, kind):  # type: ignore[no-untyped-def]
        self._called()
        return (_Job(self.waiting.pop(0)), _Queue()) if self.waiting else None

    def put_back(self, job, queue) -> None:  # type: ignore[no-untyped-def]
        self._called()
        self.put_back_ids.append(job.id)

    def must_run_alone(self, job) -> bool:  # type: ignore[no-untyped-def]
        self._called()
        return job.id in self.alone

    def start(self, job, queue):  # type: ignore[no-untyped-def]
        self._called()
        claimed = self.runner.claim(job.id)
        if claimed is None:
            return None
        self.started.append(job.id)
        return Started(job, queue, None, threading.Event(), claimed)  # type: ignore[arg-type]

    def end(self, job, execution) -> None:  # type: ignore[no-untyped-def]
        self._called()
        self.ended.append(job.id)

    def fail(self, job, queue, execution) -> None:  # type: ignore[no-untyped-def]
        self._called()
        self.ended.append(job.id)


@pytest.fixture
def runner(database_url, redis_url):
    with real_runner(database_url, redis_url, slots=3) as parts:
        yield parts.runner, parts.writer, parts.sessions


def _run(runner, session, n_jobs: int, **host_options) -> tuple[ListHost, list]:
    job_runner, writer, sessions = runner
    ids = [j.id for j in store.insert_jobs(session, [make_job(request=GEN) for _ in range(n_jobs)])]
    host = ListHost(job_runner, ids[1:], **host_options)
    GenerationRun(host, _Queue(), MODEL, "generate").run(_Job(ids[0]))  # type: ignore[arg-type]
    assert writer.flush()
    with sessions() as s:
        rows = [store.get_job(s, i) for i in ids]
    return host, rows


def test_a_run_takes_every_waiting_job_of_its_model_and_settles_each_once(runner, session):
    host, rows = _run(runner, session, 7)  # more jobs than the 3 slots
    assert [r.status for r in rows] == ["succeeded"] * 7
    assert sorted(host.ended) == sorted(host.started) == sorted(r.id for r in rows)
    assert len({r.result["text"] for r in rows}) == 1  # same greedy request, same text
    assert all(r.cached_tokens == 0 for r in rows[:1])


def test_the_engine_thread_never_calls_its_host(runner, session):
    """Intake off the loop: claims, Redis, tokenising and settling are the desk's."""
    host, _rows = _run(runner, session, 4)
    assert host.threads and all(name.startswith("desk-") for name in host.threads)


def test_a_worker_told_to_stop_takes_no_more_and_finishes_what_runs(runner, session):
    host, rows = _run(runner, session, 5, stop_after=2)
    assert [r.status for r in rows[:2]] == ["succeeded"] * 2
    assert [r.status for r in rows[2:]] == ["queued"] * 3 and len(host.waiting) == 3


def test_a_job_that_must_run_alone_closes_the_run(runner, session):
    job_runner, _writer, _sessions = runner
    ids = [j.id for j in store.insert_jobs(session, [make_job(request=GEN) for _ in range(3)])]
    host = ListHost(job_runner, ids[1:], alone={ids[1]})
    GenerationRun(host, _Queue(), MODEL, "generate").run(_Job(ids[0]))  # type: ignore[arg-type]
    assert host.started == [ids[0]]
    assert host.put_back_ids == [ids[1]]  # it waits in front, for a run of its own


def test_an_engine_that_breaks_fails_the_runs_jobs_instead_of_hanging(runner, session):
    """A defect in the engine thread (caused here: the decoder's step raises after two steps)
    must not leave the desk waiting for outputs that never come: it fails what it holds and
    the run ends, with the error raised for the worker's log."""
    job_runner, writer, sessions = runner
    jobs = store.insert_jobs(session, [make_job(request=GEN | {"max_tokens": 50}) for _ in range(2)])
    prepared = job_runner.prepare_generation(job_runner.claim(jobs[0].id), threading.Event(), None)
    decoder = prepared.decoder  # the model's decoder, loaded: break its step
    job_runner.refuse(jobs[0].id, "not this one")
    real_step, steps = decoder.step, []

    def breaking_step():
        steps.append(1)
        if len(steps) > 2:
            raise RuntimeError("a defect in the engine")
        return real_step()

    decoder.step = breaking_step
    host = ListHost(job_runner, [])
    try:
        with pytest.raises(RuntimeError, match="a defect"):
            GenerationRun(host, _Queue(), MODEL, "generate").run(_Job(jobs[1].id))  # type: ignore[arg-type]
    finally:
        decoder.step = real_step
    assert writer.flush()
    with sessions() as s:
        row = store.get_job(s, jobs[1].id)
    assert row.status == "failed" and "engine failed: RuntimeError: a defect" in row.error
    assert host.ended == [jobs[1].id]
