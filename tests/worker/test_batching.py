"""A generation run through its Host interface: a host that serves jobs from a list stands for
RQ's worker (which the e2e tests run for real); SQL, the runner, the writer and the model are
real. What a run promises: every waiting job of its model is taken while slots are free and
settled once; it takes nothing when told to stop or when a job must run alone; and the engine
thread never calls its host (claims, Redis and settling all happen on the desk)."""

from __future__ import annotations

import threading
import time

import pytest

from gpuq import store
from tests.gpuq.store.test_store import make_job
from tests.worker.generation import ListHost, real_runner, run_listed

GEN = {"prompt": "Count: one, two,", "max_tokens": 8, "temperature": 0.0, "top_p": 1.0, "seed": 1, "stop": []}


@pytest.fixture
def runner(database_url, redis_url):
    with real_runner(database_url, redis_url, slots=3) as parts:
        yield parts.runner, parts.writer, parts.sessions


def _run(runner, session, n_jobs: int, **host_options) -> tuple[ListHost, list]:
    job_runner, writer, sessions = runner
    ids = [j.id for j in store.insert_jobs(session, [make_job(request=GEN) for _ in range(n_jobs)])]
    host = ListHost(job_runner, ids[1:], **host_options)
    run_listed(host, ids[0])
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


def test_a_job_is_taken_for_a_slot_while_the_step_that_frees_it_runs(runner, session):
    """A sequence whose next token is its last by length frees its slot at the next step for
    sure: the desk takes a job for it while that step runs, and the job goes in at the very
    next step, instead of the slot decoding nothing for a step while the desk claims a job."""
    job_runner, writer, sessions = runner
    jobs = store.insert_jobs(session, [make_job(request=GEN) for _ in range(5)])
    prepared = job_runner.prepare_generation(job_runner.claim(jobs[0].id), threading.Event(), None)
    decoder = prepared.decoder  # the model's decoder, loaded: watch its steps
    job_runner.refuse(jobs[0].id, "not this one")
    ids = [j.id for j in jobs[1:]]  # 4 jobs for 3 slots
    real_step, real_prepare = decoder.step, job_runner.prepare_generation
    prepared_ids: list[str] = []
    steps: list[tuple[set[str], list[str]]] = []  # each step's live requests, and those it finished

    def recorded_prepare(claimed, cancel, deadline):
        out = real_prepare(claimed, cancel, deadline)
        prepared_ids.append(claimed.id)
        return out

    def watched_step():
        if decoder.freed_next_step and ids[3] not in prepared_ids:  # this step frees a slot
            deadline = time.monotonic() + 10
            while ids[3] not in prepared_ids and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.05)  # the desk hands a request over right after preparing it
        live = set(decoder.live_keys())
        finished = real_step()
        steps.append((live, [f.key for f in finished]))
        return finished

    decoder.step, job_runner.prepare_generation = watched_step, recorded_prepare
    host = ListHost(job_runner, ids[1:])
    try:
        run_listed(host, ids[0])
    finally:
        decoder.step, job_runner.prepare_generation = real_step, real_prepare
    assert writer.flush()
    with sessions() as s:
        assert [store.get_job(s, i).status for i in ids] == ["succeeded"] * 4
    first_end = next(i for i, (_live, finished) in enumerate(steps) if finished)
    assert ids[3] not in steps[first_end][0] and ids[3] in steps[first_end + 1][0]


def test_a_slot_freed_by_a_stop_goes_to_the_next_job_before_the_ended_one_is_settled(database_url, redis_url, session):
    """A stop string (unlike a length limit) cannot be foreseen: its slot frees at the step that
    finds it. The desk takes the next job first and settles the ended one after (RQ's
    bookkeeping, the outcome's commit), so the next admission waits for neither."""
    with real_runner(database_url, redis_url, slots=1) as parts:
        jobs = store.insert_jobs(session, [make_job(request=GEN | {"stop": [","], "max_tokens": 50}) for _ in range(3)])
        ids = [j.id for j in jobs]
        host = ListHost(parts.runner, ids[1:])
        run_listed(host, ids[0])
        assert parts.writer.flush()
        with parts.sessions() as s:
            rows = [store.get_job(s, i) for i in ids]
    assert [(r.status, r.result["finish_reason"]) for r in rows] == [("succeeded", "stop")] * 3
    assert host.calls == [
        ("start", ids[0]),
        ("start", ids[1]),
        ("end", ids[0]),
        ("start", ids[2]),
        ("end", ids[1]),
        ("end", ids[2]),
    ]


def test_a_worker_told_to_stop_takes_no_more_and_finishes_what_runs(runner, session):
    host, rows = _run(runner, session, 5, stop_after=2)
    assert [r.status for r in rows[:2]] == ["succeeded"] * 2
    assert [r.status for r in rows[2:]] == ["queued"] * 3 and len(host.waiting) == 3


def test_a_job_that_must_run_alone_closes_the_run(runner, session):
    job_runner, _writer, _sessions = runner
    ids = [j.id for j in store.insert_jobs(session, [make_job(request=GEN) for _ in range(3)])]
    host = ListHost(job_runner, ids[1:], alone={ids[1]})
    run_listed(host, ids[0])
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
            run_listed(host, jobs[1].id)
    finally:
        decoder.step = real_step
    assert writer.flush()
    with sessions() as s:
        row = store.get_job(s, jobs[1].id)
    assert row.status == "failed" and "engine failed: RuntimeError: a defect" in row.error
    assert host.ended == [jobs[1].id]


def test_a_desk_that_breaks_fails_the_runs_jobs_instead_of_leaving_them_running(runner, session):
    """A defect on the desk thread (caused here: recording the second job's admission raises)
    must not leave the jobs it holds running forever, their executions heartbeat by the worker:
    the engine drops its sequences at once, every job in hand fails with the reason, nothing
    more is taken, and the run raises the error for the worker's log."""
    job_runner, writer, sessions = runner
    jobs = store.insert_jobs(session, [make_job(request=GEN | {"max_tokens": 200}) for _ in range(5)])
    prepared = job_runner.prepare_generation(job_runner.claim(jobs[0].id), threading.Event(), None)
    decoder = prepared.decoder  # the model's decoder, loaded: count its steps
    job_runner.refuse(jobs[0].id, "not this one")
    ids = [j.id for j in jobs[1:]]  # 4 jobs for 3 slots: the last waits at least
    real_step, real_admitted = decoder.step, job_runner.admitted
    steps, steps_at_break = [], []

    def counted_step():
        steps.append(1)
        return real_step()

    def breaking_admitted(key, cached, decoded):
        if key == ids[1]:
            steps_at_break.append(len(steps))
            raise RuntimeError("a defect on the desk")
        real_admitted(key, cached, decoded)

    decoder.step, job_runner.admitted = counted_step, breaking_admitted
    host = ListHost(job_runner, ids[1:])
    try:
        with pytest.raises(RuntimeError, match="a defect on the desk"):
            run_listed(host, ids[0])
    finally:
        decoder.step, job_runner.admitted = real_step, real_admitted
    assert writer.flush()
    with sessions() as s:
        rows = [store.get_job(s, i) for i in ids]
    taken = [r for r in rows if r.id in host.started]  # the first two at least; a third if it came in time
    assert [r.id for r in taken] == ids[: len(taken)] and 2 <= len(taken) <= 3
    assert all(r.status == "failed" and "desk failed: RuntimeError: a defect on the desk" in r.error for r in taken)
    assert sorted(host.ended) == sorted(r.id for r in taken)
    assert [r.status for r in rows[len(taken) :]] == ["queued"] * (4 - len(taken))
    assert host.waiting == ids[len(taken) :]  # nothing taken after the break
    assert len(steps) <= steps_at_break[0] + 3  # dropped, not decoded on to their 200 tokens
