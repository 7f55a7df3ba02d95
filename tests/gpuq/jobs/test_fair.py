"""Fair shares between tenants within a priority, on a real Redis: the pick's order, weights,
priorities, aging, positions that match the order jobs really leave in, and the bells idle
workers wait on."""

from __future__ import annotations

from datetime import timedelta

from redis import Redis

from gpuq.db.tables import utcnow
from gpuq.jobs import enqueue, fair
from gpuq.jobs.aging import promote_aged_jobs
from gpuq.jobs.enqueue import enqueue_jobs, remove_queued
from gpuq.queue_names import Priority, QueueEntry, band_name, queue_name
from gpuq.redis_keys import fair_bell_key, fair_edf_key, rq_queue_key

MODEL = "m"
NORMAL = band_name(MODEL, "generate", Priority.NORMAL)
HIGH = band_name(MODEL, "generate", Priority.HIGH)


def jobs(owner: str | None, n: int, priority: Priority = Priority.NORMAL, model: str = MODEL) -> list[QueueEntry]:
    return [
        QueueEntry(f"{owner or 'none'}-{model}-{priority.label}-{i}", model, "generate", priority, owner)
        for i in range(n)
    ]


def take_all(redis: Redis, bands: list[str]) -> list[str]:
    picker = fair.Picker(redis, bands)
    taken = []
    while (got := picker.take()) is not None:
        taken.append(got[1])
    return taken


def test_a_tenant_behind_another_tenants_long_backlog_waits_about_one_round(redis):
    enqueue_jobs(redis, jobs("alice", 96), timeout_s=60)
    picker = fair.Picker(redis, [NORMAL])
    early = [picker.take() for _ in range(3)]  # taken before bob arrives
    enqueue_jobs(redis, jobs("bob", 4), timeout_s=60)

    order = [job for _queue, job in early if job] + take_all(redis, [NORMAL])

    bob_last = max(i for i, job in enumerate(order) if job.startswith("bob"))
    alices_before = sum(1 for job in order[:bob_last] if job.startswith("alice"))
    assert alices_before <= 3 + 4  # those taken already, and one of alice's per job of bob's
    assert sorted(order) == sorted(e.job_id for e in jobs("alice", 96) + jobs("bob", 4))  # each once
    # Each tenant's own jobs keep their order.
    assert [j for j in order if j.startswith("alice")] == [e.job_id for e in jobs("alice", 96)]


def test_before_fair_shares_the_same_arrivals_in_one_queue_ran_first_in_first_out(redis):
    """The baseline the test above improves on: one queue for both tenants (jobs of no tenant)."""
    both = [QueueEntry(e.job_id, MODEL, "generate", Priority.NORMAL) for e in jobs("alice", 96) + jobs("bob", 4)]
    enqueue_jobs(redis, both, timeout_s=60)
    order = take_all(redis, [NORMAL])
    assert order.index("bob-m-normal-3") == 99


def test_weights_share_jobs_in_their_ratio_while_both_wait(redis):
    fair.set_weights(redis, {"alice": 2})
    enqueue_jobs(redis, jobs("alice", 60) + jobs("bob", 60), timeout_s=60)

    first = take_all(redis, [NORMAL])[:45]

    assert sum(j.startswith("alice") for j in first) == 30
    assert sum(j.startswith("bob") for j in first) == 15


def test_weights_come_from_sql_the_heaviest_active_key_of_each_tenant(session, redis):
    from gpuq import store
    from gpuq.db.tables import Role

    store.create_api_key(session, name="a1", owner="alice", role=Role.SUBMITTER, weight=3)
    store.create_api_key(session, name="a2", owner="alice", role=Role.SUBMITTER)
    store.create_api_key(session, name="b", owner="bob", role=Role.SUBMITTER)
    fair.sync_weights(session, redis)
    enqueue_jobs(redis, jobs("alice", 40) + jobs("bob", 40), timeout_s=60)

    first = take_all(redis, [NORMAL])[:40]

    assert sum(j.startswith("alice") for j in first) == 30


def test_a_higher_priority_always_goes_first_whatever_the_shares(redis):
    enqueue_jobs(redis, jobs("alice", 5, Priority.NORMAL) + jobs("bob", 5, Priority.HIGH), timeout_s=60)
    fair.set_weights(redis, {"alice": 100})
    order = take_all(redis, [HIGH, NORMAL])
    assert [j.split("-")[0] for j in order] == ["bob"] * 5 + ["alice"] * 5


def test_an_idle_tenant_gets_no_credit_for_the_time_it_was_away(redis):
    enqueue_jobs(redis, jobs("alice", 50), timeout_s=60)
    picker = fair.Picker(redis, [NORMAL])
    for _ in range(40):
        picker.take()  # alice alone: bob's absence banks nothing for him
    enqueue_jobs(redis, jobs("bob", 20), timeout_s=60)

    order = take_all(redis, [NORMAL])[:20]

    assert sum(j.startswith("bob") for j in order) == 10  # turn about, not 20 of bob's first


def test_the_desk_takes_only_from_its_band_and_only_when_nothing_more_urgent_waits(redis):
    other = band_name("other", "generate", Priority.HIGH)
    enqueue_jobs(redis, jobs("alice", 2), timeout_s=60)
    picker = fair.Picker(redis, [other, NORMAL])

    assert picker.take(only=[NORMAL]) is not None  # nothing waits in the band ahead
    enqueue_jobs(redis, jobs("bob", 1, Priority.HIGH, model="other"), timeout_s=60)
    assert picker.take(only=[NORMAL]) is None  # a more urgent job of another model waits
    assert redis.llen(rq_queue_key(queue_name(MODEL, "generate", Priority.NORMAL, "alice"))) == 1  # untouched


def test_aging_moves_a_job_up_within_its_tenant_and_it_runs_within_a_round_there(redis):
    enqueue_jobs(redis, jobs("bob", 1, Priority.LOW), timeout_s=60)
    moved = promote_aged_jobs(redis, aging_s=60, now=utcnow() + timedelta(seconds=61))
    enqueue_jobs(redis, jobs("alice", 30, Priority.NORMAL), timeout_s=60)  # a backlog there

    assert moved == ["bob-m-low-0"]
    assert redis.lrange(rq_queue_key(queue_name(MODEL, "generate", Priority.NORMAL, "bob")), 0, -1) == [b"bob-m-low-0"]
    order = take_all(redis, [NORMAL, band_name(MODEL, "generate", Priority.LOW)])
    assert order.index("bob-m-low-0") <= 1


def test_positions_are_the_order_jobs_leave_in(redis):
    fair.set_weights(redis, {"carol": 3})
    enqueue_jobs(redis, jobs("alice", 12), timeout_s=60)
    picker = fair.Picker(redis, [NORMAL])
    for _ in range(5):
        picker.take()  # passes and the band's virtual time move on
    enqueue_jobs(redis, jobs("bob", 4) + jobs("carol", 9) + jobs(None, 3), timeout_s=60)
    remove_queued(redis, [jobs("carol", 9)[4]])  # a cancel leaves a gap

    state = fair.band_state(redis, NORMAL)
    waiting = {
        tenant: [x.decode() for x in redis.lrange(rq_queue_key(f"{NORMAL}:{tenant}" if tenant else NORMAL), 0, -1)]
        for tenant in state.flows
    }
    predicted = {job: state.jobs_ahead(tenant, i) for tenant, ids in waiting.items() for i, job in enumerate(ids)}

    order = take_all(redis, [NORMAL])

    assert sorted(predicted.values()) == list(range(len(order)))
    assert {job: order.index(job) for job in order} == predicted
    assert [waiting[tenant][i] for tenant, i in state.order()] == order


def test_a_push_rings_the_bell_and_finding_nothing_silences_it(redis):
    picker = fair.Picker(redis, [NORMAL])
    enqueue_jobs(redis, jobs("alice", 3), timeout_s=60)
    assert redis.llen(fair_bell_key(NORMAL)) == 3  # up to three idle workers wake
    assert picker.wait(1) is True
    take_all(redis, [NORMAL])  # ends with a pick that finds nothing
    assert redis.llen(fair_bell_key(NORMAL)) == 0  # no stale token wakes a worker for nothing

    fair.push_front(redis, queue_name(MODEL, "generate", Priority.NORMAL, "alice"), "again")
    assert picker.wait(1) is True and picker.take() == (f"{NORMAL}:alice", "again")


def test_a_queue_pushed_to_behind_gpuqs_back_is_found_again_by_the_reconciler_pass(redis):
    name = queue_name(MODEL, "generate", Priority.NORMAL, "alice")
    redis.rpush(rq_queue_key(name), "pushed-by-hand")
    redis.sadd("rq:queues", rq_queue_key(name))
    picker = fair.Picker(redis, [NORMAL])
    assert picker.take() is None

    assert fair.register_flows(redis) == 1
    assert picker.take() == (name, "pushed-by-hand")


def test_jobs_of_no_tenant_wait_in_the_bands_own_queue_and_share_like_a_tenant(redis):
    enqueue_jobs(redis, jobs(None, 3) + jobs("alice", 3), timeout_s=60)
    assert redis.llen(rq_queue_key(NORMAL)) == 3
    order = take_all(redis, [NORMAL])
    assert [j.split("-")[0] for j in order] == ["none", "alice"] * 3


def test_a_jobs_position_counts_the_turns_other_tenants_get_before_it(session, redis):
    from gpuq.db.tables import Job
    from gpuq.jobs.position import job_position

    def row(job_id: str, owner: str, priority: Priority) -> Job:
        return Job(
            id=job_id, kind="generate", model=MODEL, priority=priority, status="queued", request_hash="h",
            request={}, owner=owner,
        )  # fmt: skip

    entries = jobs("alice", 10) + jobs("bob", 3) + jobs("carol", 2, Priority.HIGH)
    session.add_all([row(e.job_id, e.owner or "", Priority(e.priority)) for e in entries])
    session.commit()
    enqueue_jobs(redis, entries, timeout_s=60)

    bobs_last = job_position(session, redis, session.get_one(Job, "bob-m-normal-2"))
    alices_fifth = job_position(session, redis, session.get_one(Job, "alice-m-normal-4"))

    # Before bob's third: carol's 2 (higher priority), bob's own 2, and alice's first 3 (turns tie; alice sorts first).
    assert (bobs_last.ahead_in_higher_priorities, bobs_last.ahead_in_queue, bobs_last.position) == (2, 5, 7)
    assert bobs_last.queue == f"{NORMAL}:bob"
    assert (alices_fifth.ahead_in_queue, alices_fifth.position) == (4 + 3, 9)  # bob has only 3
    order = take_all(redis, [HIGH, NORMAL])
    assert order.index("bob-m-normal-2") == 7 and order.index("alice-m-normal-4") == 9


# ---------------------------------------------------------------- deadlines: earliest first within a tenant's queue

SOON = utcnow() + timedelta(hours=1)


def dated(owner: str | None, name: str, minutes: int | None, priority: Priority = Priority.NORMAL) -> QueueEntry:
    deadline = None if minutes is None else SOON + timedelta(minutes=minutes)
    return QueueEntry(f"{owner or 'none'}-{name}", MODEL, "generate", priority, owner, deadline)


def test_a_tenants_jobs_with_a_deadline_go_first_earliest_first_equal_ones_in_queueing_order(redis):
    enqueue_jobs(redis, [dated("alice", "plain-1", None), dated("alice", "d30", 30)], timeout_s=60)
    enqueue_jobs(redis, [dated("alice", "d10-a", 10), dated("alice", "plain-2", None)], timeout_s=60)
    enqueue_jobs(redis, [dated("alice", "d10-b", 10), dated("alice", "d5", 5)], timeout_s=60)

    order = take_all(redis, [NORMAL])

    assert order == ["alice-d5", "alice-d10-a", "alice-d10-b", "alice-d30", "alice-plain-1", "alice-plain-2"]
    assert redis.zcard(fair_edf_key(f"{NORMAL}:alice")) == 0  # nothing left behind


def test_deadline_jobs_queued_in_chunks_are_merged_into_a_queue_of_both_kinds(redis, monkeypatch):
    monkeypatch.setattr(enqueue, "SCRIPT_CHUNK", 3)  # several script calls for one queue
    enqueue_jobs(
        redis, [dated("alice", "d20", 20), dated("alice", "old", None), dated("alice", "d40", 40)], timeout_s=60
    )
    arriving = [dated("alice", f"new{i}", [50, 10, 40, None, 20, 10, 5][i]) for i in range(7)]

    enqueue_jobs(redis, arriving, timeout_s=60)

    assert [j.removeprefix("alice-") for j in take_all(redis, [NORMAL])] == [
        *["new6", "new1", "new5", "d20", "new4", "d40", "new2", "new0"],  # by deadline; equal ones as queued
        *["old", "new3"],
    ]


def test_the_queues_list_holds_every_job_in_the_order_they_are_given_out(redis):
    """So RQ's tools count them all, a cancel is one LREM, and a position is an index."""
    enqueue_jobs(redis, [dated("alice", "plain", None), dated("alice", "d5", 5)], timeout_s=60)
    assert redis.lrange(rq_queue_key(f"{NORMAL}:alice"), 0, -1) == [b"alice-d5", b"alice-plain"]

    remove_queued(redis, [dated("alice", "d5", 5)])  # cancelled before a worker took it

    assert redis.zcard(fair_edf_key(f"{NORMAL}:alice")) == 0
    assert take_all(redis, [NORMAL]) == ["alice-plain"]


def test_deadlines_order_a_tenants_own_jobs_and_buy_no_larger_share(redis):
    enqueue_jobs(redis, [dated("alice", f"d{i}", i) for i in range(6)], timeout_s=60)
    enqueue_jobs(redis, [dated("bob", f"plain{i}", None) for i in range(6)], timeout_s=60)

    order = take_all(redis, [NORMAL])

    assert [j.split("-")[0] for j in order] == ["alice", "bob"] * 6


def test_a_job_put_back_in_front_keeps_its_deadlines_place(redis):
    enqueue_jobs(redis, [dated("alice", "plain", None), dated("alice", "d5", 5), dated("alice", "d9", 9)], timeout_s=60)
    picker = fair.Picker(redis, [NORMAL])
    assert picker.take() == (f"{NORMAL}:alice", "alice-d5")

    fair.push_front(redis, f"{NORMAL}:alice", "alice-d5")  # popped, not run (a drained worker)

    assert take_all(redis, [NORMAL]) == ["alice-d5", "alice-d9", "alice-plain"]


def test_an_aged_job_with_a_deadline_goes_by_it_in_the_queue_above(redis):
    enqueue_jobs(redis, [dated("alice", "low-d20", 20, Priority.LOW)], timeout_s=60)
    moved = promote_aged_jobs(redis, aging_s=60, now=utcnow() + timedelta(seconds=61))
    enqueue_jobs(
        redis, [dated("alice", "plain", None), dated("alice", "d10", 10), dated("alice", "d30", 30)], timeout_s=60
    )

    assert moved == ["alice-low-d20"]
    assert redis.zcard(fair_edf_key(f"{band_name(MODEL, 'generate', Priority.LOW)}:alice")) == 0
    assert take_all(redis, [NORMAL]) == ["alice-d10", "alice-low-d20", "alice-d30", "alice-plain"]


def test_positions_with_deadlines_are_the_order_jobs_leave_in(redis):
    fair.set_weights(redis, {"bob": 2})
    enqueue_jobs(
        redis, [dated("alice", "plain-1", None), dated("alice", "d7", 7), dated("alice", "plain-2", None)], timeout_s=60
    )
    enqueue_jobs(redis, [dated("alice", "d3", 3), dated("alice", "d7-b", 7)], timeout_s=60)
    enqueue_jobs(
        redis, [dated("bob", f"b{i}", None if i % 2 else i) for i in range(7)] + [dated(None, "x", 4)], timeout_s=60
    )
    fair.Picker(redis, [NORMAL]).take()  # passes move on

    state = fair.band_state(redis, NORMAL)
    waiting = {
        tenant: [x.decode() for x in redis.lrange(rq_queue_key(f"{NORMAL}:{tenant}" if tenant else NORMAL), 0, -1)]
        for tenant in state.flows
    }
    predicted = {job: state.jobs_ahead(tenant, i) for tenant, ids in waiting.items() for i, job in enumerate(ids)}

    order = take_all(redis, [NORMAL])

    assert {job: order.index(job) for job in order} == predicted
    assert [waiting[tenant][i] for tenant, i in state.order()] == order
