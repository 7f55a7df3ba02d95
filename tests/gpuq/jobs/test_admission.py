"""Admission by work on a real Redis and both databases: positions and ETAs count the tokens
ahead at the model's measured pace, and a job that cannot be done by its deadline is refused."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from redis import Redis
from sqlalchemy.orm import Session

from gpuq.db.tables import Job, utcnow
from gpuq.errors import RequestError
from gpuq.jobs import admission, position
from gpuq.jobs.admission import Planned
from gpuq.jobs.enqueue import enqueue_jobs
from gpuq.jobs.position import job_position
from gpuq.queue_names import Priority, QueueEntry
from gpuq.stats import throughput
from tests.conftest import both_databases

NOW = utcnow()


def finished(n: int, model: str, *, end: datetime, run_s: float = 5.0, prompt: int = 100, completion: int = 50) -> Job:
    """A job of the model's recent history: 100 prompt tokens, 50 generated of a budget of 100."""
    return Job(
        id=f"done-{model}-{n}",
        kind="generate",
        model=model,
        priority=Priority.NORMAL,
        status="succeeded",
        request_hash="h",
        request={"max_tokens": 100},
        completion_budget=100,
        prompt_tokens=prompt,
        completion_tokens=completion,
        created_at=end - timedelta(seconds=run_s + 1),
        started_at=end - timedelta(seconds=run_s),
        finished_at=end,
    )


def history(model: str, jobs: int = 10) -> list[Job]:
    """``jobs`` jobs run one after another, 5 s each, ending a minute ago: 150 tokens every 5 s, 30 tokens/s."""
    return [finished(i, model, end=NOW - timedelta(minutes=1) - timedelta(seconds=5 * i)) for i in range(jobs)]


def waiting(
    job_id: str,
    model: str,
    *,
    prompt: int | None,
    budget: int = 16,
    owner: str = "acme",
    priority: Priority = Priority.NORMAL,
    deadline: datetime | None = None,
) -> Job:
    return Job(
        id=job_id,
        kind="generate",
        model=model,
        priority=priority,
        status="queued",
        request_hash="h",
        request={"max_tokens": budget},
        completion_budget=budget,
        prompt_tokens=prompt,
        owner=owner,
        deadline=deadline,
        created_at=NOW,
    )


def queue(session: Session, redis: Redis, *jobs: Job) -> None:
    session.add_all(jobs)
    session.commit()
    enqueue_jobs(redis, [QueueEntry.of(j) for j in jobs], timeout_s=60)


@both_databases
def test_a_job_behind_one_long_prompt_gets_a_later_eta_than_one_behind_one_short_prompt(session, redis):
    session.add_all(history("long-m") + history("short-m"))  # the same pace for both: 30 tokens/s
    queue(session, redis, waiting("long-front", "long-m", prompt=2000), waiting("behind-long", "long-m", prompt=10))
    queue(session, redis, waiting("short-front", "short-m", prompt=20), waiting("behind-short", "short-m", prompt=10))

    behind_long = job_position(session, redis, session.get_one(Job, "behind-long"), now=NOW)
    behind_short = job_position(session, redis, session.get_one(Job, "behind-short"), now=NOW)

    assert behind_long.position == behind_short.position == 1  # as jobs, the two queues look alike
    # The front job may generate 16 tokens, of which the model's jobs lately used half.
    assert (behind_long.prompt_tokens_ahead, behind_long.completion_tokens_ahead) == (2000, 8)
    assert (behind_short.prompt_tokens_ahead, behind_short.completion_tokens_ahead) == (20, 8)
    assert behind_long.tokens_per_s == behind_short.tokens_per_s == 30.0
    assert behind_long.eta_s == round(2008 / 30, 1) and behind_short.eta_s == round(28 / 30, 1)
    assert behind_long.eta_s > 50 * behind_short.eta_s


def test_the_pace_is_tokens_over_the_time_something_ran_overlaps_counted_once():
    start = NOW - timedelta(minutes=5)
    runs = [(start, start + timedelta(seconds=10)), (start + timedelta(seconds=4), start + timedelta(seconds=12))]
    runs.append((start + timedelta(seconds=100), start + timedelta(seconds=103)))  # after an idle stretch
    assert throughput.busy_seconds(runs) == 15.0


@both_databases
def test_a_prompt_not_counted_at_submission_counts_as_the_models_recent_mean(session, redis):
    session.add_all(history("m"))  # prompts of 100 tokens
    queue(session, redis, waiting("uncounted", "m", prompt=None, budget=0), waiting("me", "m", prompt=5))

    me = job_position(session, redis, session.get_one(Job, "me"), now=NOW)

    assert (me.prompt_tokens_ahead, me.completion_tokens_ahead) == (100, 0)


@both_databases
def test_a_deep_queue_is_read_from_its_front_and_the_rest_counted_at_their_mean(session, redis, monkeypatch):
    monkeypatch.setattr(position, "SAMPLE_PER_QUEUE", 4)
    session.add_all(history("m"))
    ahead = [waiting(f"a{i}", "m", prompt=40 if i < 4 else 1000, budget=0) for i in range(10)]
    queue(session, redis, *ahead, waiting("me", "m", prompt=5))

    me = job_position(session, redis, session.get_one(Job, "me"), now=NOW)

    assert me.position == 10 and me.prompt_tokens_ahead == 400  # 10 jobs at the mean of the first 4


@both_databases
def test_higher_priorities_count_whole_and_other_tenants_up_to_their_turns(session, redis):
    session.add_all(history("m"))
    queue(session, redis, *[waiting(f"hi{i}", "m", prompt=300, budget=0, priority=Priority.HIGH) for i in range(2)])
    queue(session, redis, *[waiting(f"alice{i}", "m", prompt=50, budget=0, owner="alice") for i in range(5)])
    queue(session, redis, waiting("bob0", "m", prompt=7, budget=0, owner="bob"))

    bob = job_position(session, redis, session.get_one(Job, "bob0"), now=NOW)

    # Both high jobs, and alice's first (the turns tie; alice sorts first): not all five of hers.
    assert (bob.ahead_in_higher_priorities, bob.ahead_in_queue, bob.prompt_tokens_ahead) == (2, 1, 650)


def planned(model: str, deadline: datetime, *, owner: str = "acme", prompt: int = 10, budget: int = 0) -> Planned:
    return Planned(model, "generate", Priority.NORMAL, owner, deadline, 1, prompt, 0, budget)


@both_databases
def test_a_job_that_cannot_be_done_by_its_deadline_is_refused_with_how_long_to_wait(session, redis):
    session.add_all(history("m"))
    # Higher-priority work: 3000 tokens, 100 s at 30 tokens/s (its own tenant's jobs without a
    # deadline would go after it).
    queue(session, redis, *[waiting(f"a{i}", "m", prompt=1000, budget=0, priority=Priority.HIGH) for i in range(3)])

    soon = planned("m", NOW + timedelta(seconds=60))
    verdict = admission.judge(session, redis, soon, now=NOW)
    with pytest.raises(RequestError) as refused:
        admission.refuse_late(soon, verdict)

    assert verdict.eta_s == pytest.approx(3010 / 30) and verdict.late_by_s == pytest.approx(3010 / 30 - 60)
    assert refused.value.status == 429 and refused.value.code == "deadline_unreachable"
    assert refused.value.headers == {"Retry-After": str(int(3010 / 30 - 60) + 1)}
    assert "3010 tokens" in refused.value.message and "about 40 s late" in refused.value.message
    later = planned("m", NOW + timedelta(seconds=120))
    admission.refuse_late(later, admission.judge(session, redis, later, now=NOW))  # in time: no refusal


@both_databases
def test_a_deadline_earlier_than_its_tenants_others_is_judged_from_in_front_of_them(session, redis):
    session.add_all(history("m"))
    queue(session, redis, waiting("big", "m", prompt=6000, budget=0, deadline=NOW + timedelta(hours=1)))

    before = admission.judge(session, redis, planned("m", NOW + timedelta(minutes=2)), now=NOW)
    after = admission.judge(session, redis, planned("m", NOW + timedelta(hours=2)), now=NOW)
    other = admission.judge(session, redis, planned("m", NOW + timedelta(minutes=2), owner="bob"), now=NOW)

    assert before.work.tokens == 10 and before.late_by_s == 0  # it goes before the later deadline
    assert after.work.tokens == 6010
    assert (
        other.work.tokens == 6010
    )  # another tenant's turn: the first job of acme's goes first (ties: acme sorts first)


@both_databases
def test_a_model_with_no_pace_lately_refuses_nothing(session, redis):
    queue(session, redis, *[waiting(f"a{i}", "idle", prompt=1000, budget=0) for i in range(3)])
    soon = planned("idle", NOW + timedelta(seconds=1))

    verdict = admission.judge(session, redis, soon, now=NOW)
    admission.refuse_late(soon, verdict)

    assert verdict.eta_s is None and verdict.tokens_per_s is None
