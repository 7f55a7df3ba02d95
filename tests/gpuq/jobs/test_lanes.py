"""Workers' lanes (prefix-aware placement, ``gpuq.jobs.prefix_routing``) on a real Redis: the
pick takes a worker's own lane first within its tenant's fair turn, keeps priority and fair
shares before affinity, lets another worker steal a lane's job only past the bound; cancel and
hand-back; and the placement itself, with its load guard, promises and tenant-salted chains."""

from __future__ import annotations

import json
import time
from datetime import timedelta

from redis import Redis
from redis.typing import EncodableT, FieldT

from gpuq.db.tables import utcnow
from gpuq.jobs import fair
from gpuq.jobs.enqueue import enqueue_jobs, remove_queued
from gpuq.jobs.prefix_routing import PrefixRouting, hand_back, hand_back_lanes, place
from gpuq.prefix_blocks import block_hashes, cache_scope, namespace_salt
from gpuq.queue_names import Priority, QueueEntry, band_name, parse_queue, queue_name
from gpuq.redis_keys import (
    DRAIN_FIELD,
    GENERATES_FIELD,
    METRICS_PLACEMENT,
    SLOTS_BUSY_FIELD,
    SLOTS_FIELD,
    prefix_index_key,
    rq_job_key,
    rq_queue_key,
    rq_worker_key,
)

MODEL = "m"
NORMAL = band_name(MODEL, "generate", Priority.NORMAL)
HIGH = band_name(MODEL, "generate", Priority.HIGH)
W1, W2 = "host.0.101.aa", "host.1.102.bb"
FINGERPRINT = b"f" * 16


def entry(job_id: str, owner: str | None = "alice", *, lane: str = "", priority: Priority = Priority.NORMAL, **kw):
    return QueueEntry(job_id, MODEL, "generate", priority, owner, lane=lane, **kw)


def test_lane_queue_names_parse_back_to_their_band_tenant_and_worker():
    name = entry("j", "alice", lane=W1).queue
    assert name == f"{NORMAL}:alice@{W1}"
    parsed = parse_queue(name)
    assert (parsed.band, parsed.tenant, parsed.lane, parsed.shared) == (NORMAL, "alice", W1, f"{NORMAL}:alice")
    no_tenant = parse_queue(entry("j", None, lane=W1).queue)
    assert (no_tenant.tenant, no_tenant.lane, no_tenant.shared) == ("", W1, NORMAL)
    assert parse_queue(queue_name(MODEL, "generate", Priority.NORMAL, "alice")).lane == ""


def test_a_worker_takes_its_own_lane_first_within_its_tenants_turn(redis):
    enqueue_jobs(redis, [entry("shared-1"), entry("shared-2")], timeout_s=60)
    enqueue_jobs(redis, [entry("lane-1", lane=W1)], timeout_s=60)

    w1 = fair.Picker(redis, [NORMAL], lane=W1)
    assert w1.take() == (f"{NORMAL}:alice@{W1}", "lane-1")
    assert w1.last_how == "own"
    assert w1.take() == (f"{NORMAL}:alice", "shared-1")
    assert w1.last_how == "shared"


def test_another_worker_leaves_a_lanes_job_until_it_waited_past_the_steal_bound(redis):
    enqueue_jobs(redis, [entry("lane-1", lane=W1)], timeout_s=60)
    w2 = fair.Picker(redis, [NORMAL], lane=W2, steal_s=0.3)

    assert w2.take() is None
    assert w2.steal_in_s is not None and 0 < w2.steal_in_s <= 0.3  # it knows when to look again
    time.sleep(0.35)
    assert w2.take() == (f"{NORMAL}:alice@{W1}", "lane-1")
    assert w2.last_how == "stolen"


def test_priority_comes_before_a_workers_own_lane(redis):
    enqueue_jobs(redis, [entry("lane-normal", lane=W1)], timeout_s=60)
    enqueue_jobs(redis, [entry("shared-high", priority=Priority.HIGH)], timeout_s=60)
    w1 = fair.Picker(redis, [HIGH, NORMAL], lane=W1)
    assert [w1.take(), w1.take()] == [(f"{HIGH}:alice", "shared-high"), (f"{NORMAL}:alice@{W1}", "lane-normal")]


def test_fair_shares_between_tenants_count_their_lanes_jobs_too(redis):
    """Alice's 40 jobs placed in w1's lane do not put bob's 4 shared jobs behind all of them."""
    enqueue_jobs(redis, [entry(f"alice-{i}", lane=W1) for i in range(40)], timeout_s=60)
    enqueue_jobs(redis, [entry(f"bob-{i}", "bob") for i in range(4)], timeout_s=60)
    w1 = fair.Picker(redis, [NORMAL], lane=W1)
    order = [taken[1] for _ in range(44) if (taken := w1.take())]

    assert sorted(order) == sorted([f"alice-{i}" for i in range(40)] + [f"bob-{i}" for i in range(4)])
    bob_last = max(i for i, job in enumerate(order) if job.startswith("bob"))
    assert bob_last <= 8  # one of alice's per job of bob's, about


def test_a_tenant_waiting_only_in_a_lane_is_not_forgotten_by_other_workers_picks(redis):
    enqueue_jobs(redis, [entry("lane-1", lane=W1), entry("lane-2", lane=W1)], timeout_s=60)
    w2 = fair.Picker(redis, [NORMAL], lane=W2)
    for _ in range(3):
        assert w2.take() is None  # passes over alice's empty shared queue, and drops it from the flows
    w1 = fair.Picker(redis, [NORMAL], lane=W1)
    assert [w1.take(), w1.take()] == [(f"{NORMAL}:alice@{W1}", "lane-1"), (f"{NORMAL}:alice@{W1}", "lane-2")]


def test_a_job_cancelled_in_a_lane_leaves_it(redis):
    enqueue_jobs(redis, [entry("lane-1", lane=W1), entry("lane-2", lane=W1)], timeout_s=60)
    remove_queued(redis, [entry("lane-1")])  # as the cancel has it: the entry from its SQL row, no lane
    assert redis.lrange(rq_queue_key(f"{NORMAL}:alice@{W1}"), 0, -1) == [b"lane-2"]
    assert not redis.exists(rq_job_key("lane-1"))


def test_a_lane_handed_back_goes_to_the_shared_queues_in_order_deadlines_at_their_place(redis):
    soon = utcnow() + timedelta(minutes=5)
    enqueue_jobs(redis, [entry("shared-1"), entry("shared-dated", deadline=soon + timedelta(minutes=5))], timeout_s=60)
    lane_jobs = [entry("lane-1", lane=W1), entry("lane-2", lane=W1), entry("lane-dated", lane=W1, deadline=soon)]
    enqueue_jobs(redis, lane_jobs, timeout_s=60)

    assert hand_back(redis, W1) == 3

    shared = f"{NORMAL}:alice"
    assert redis.lrange(rq_queue_key(shared), 0, -1) == [
        b"lane-dated",
        b"shared-dated",
        b"shared-1",
        b"lane-1",
        b"lane-2",
    ]
    assert redis.hget(rq_job_key("lane-1"), "origin") == shared.encode()
    anyone = fair.Picker(redis, [NORMAL], lane=W2)
    assert [anyone.take()[1] for _ in range(5)] == ["lane-dated", "shared-dated", "shared-1", "lane-1", "lane-2"]


# ---------------------------------------------------------------- placement


def register(
    redis: Redis, name: str, *, slots: int = 4, busy: int = 0, drained: bool = False, model: str = MODEL
) -> None:
    redis.sadd("rq:workers", rq_worker_key(name))
    fields: dict[FieldT, EncodableT] = {
        "state": "idle",
        SLOTS_FIELD: str(slots),
        SLOTS_BUSY_FIELD: str(busy),
        GENERATES_FIELD: json.dumps([model]),
        DRAIN_FIELD: "1" if drained else "0",
    }
    redis.hset(rq_worker_key(name), mapping=fields)


def chain(owner: str | None, family: int, blocks: int = 20) -> tuple[bytes, ...]:
    tokens = [1000 * (family + 1) + i for i in range(blocks * 16)]
    return tuple(block_hashes(tokens, namespace_salt(FINGERPRINT, cache_scope(owner, shared=False))))


ON = PrefixRouting(on=True, min_blocks=4)


def lanes_of(placed) -> list[str]:
    return [e.lane for e in placed.entries]


def test_a_job_goes_to_the_worker_whose_index_holds_its_start(redis):
    register(redis, W1)
    register(redis, W2)
    redis.sadd(prefix_index_key(W2), *chain("alice", 0))

    placed = place(redis, [entry("j")], [chain("alice", 0)], ON)

    assert lanes_of(placed) == [W2]
    assert placed.affinity == 1
    assert redis.hget(METRICS_PLACEMENT, f"{MODEL}\taffinity") == b"1"


def test_the_load_guard_sends_work_elsewhere_when_the_holder_is_loaded(redis):
    register(redis, W1, slots=2, busy=2)
    register(redis, W2, slots=2)
    redis.sadd(prefix_index_key(W1), *chain("alice", 0))
    enqueue_jobs(redis, [entry(f"old-{i}", lane=W1) for i in range(3)], timeout_s=60)  # its lane: 3 deep

    placed = place(redis, [entry("j")], [chain("alice", 0)], ON)

    assert lanes_of(placed) == [W2]  # 2 busy + 3 waiting against 0: a gap beyond its 2 slots
    assert placed.by_load == 1


def test_another_tenants_chain_never_matches(redis):
    register(redis, W1)
    register(redis, W2)
    enqueue_jobs(redis, [entry("busy-1", lane=W1)], timeout_s=60)  # W2 is the less loaded
    redis.sadd(prefix_index_key(W1), *chain("alice", 0))

    placed = place(redis, [entry("j", "bob")], [chain("bob", 0)], ON)

    assert chain("bob", 0)[0] != chain("alice", 0)[0]
    assert lanes_of(placed) == [W2]
    assert placed.affinity == 0


def test_a_bulk_of_interleaved_families_spreads_families_over_workers_not_jobs(redis):
    register(redis, W1)
    register(redis, W2)
    families = [f % 4 for f in range(16)]  # 4 families, interleaved, none held yet
    placed = place(redis, [entry(f"j{i}") for i in range(16)], [chain("alice", f) for f in families], ON)

    by_family: dict[int, set[str]] = {}
    for f, lane in zip(families, lanes_of(placed), strict=True):
        by_family.setdefault(f, set()).add(lane)
    assert all(len(lanes) == 1 for lanes in by_family.values())  # each family on one worker
    assert {next(iter(lanes)) for lanes in by_family.values()} == {W1, W2}  # the families spread


def test_short_starts_drained_workers_and_routing_off_keep_the_shared_queues(redis):
    register(redis, W1)
    register(redis, W2, drained=True)
    redis.sadd(prefix_index_key(W2), *chain("alice", 0))

    assert lanes_of(place(redis, [entry("short")], [chain("alice", 0, blocks=3)], ON)) == [""]
    assert lanes_of(place(redis, [entry("j")], [chain("alice", 0)], ON)) == [W1]  # never the drained one
    assert lanes_of(place(redis, [entry("off")], [chain("alice", 0)], PrefixRouting(on=False))) == [""]


def test_the_reconciler_hands_back_lanes_of_dead_and_drained_workers(redis):
    register(redis, W1)
    enqueue_jobs(redis, [entry("lane-dead", lane=W2), entry("lane-live", lane=W1)], timeout_s=60)
    redis.sadd(prefix_index_key(W2), b"x" * 16)

    assert hand_back_lanes(redis) == 1  # W2 is not registered: dead

    assert redis.lrange(rq_queue_key(f"{NORMAL}:alice"), 0, -1) == [b"lane-dead"]
    assert redis.lrange(rq_queue_key(f"{NORMAL}:alice@{W1}"), 0, -1) == [b"lane-live"]
    assert not redis.exists(prefix_index_key(W2))
    redis.hset(rq_worker_key(W1), DRAIN_FIELD, "1")
    assert hand_back_lanes(redis) == 1
    assert redis.lrange(rq_queue_key(f"{NORMAL}:alice"), 0, -1) == [b"lane-dead", b"lane-live"]


def test_a_lane_jobs_position_counts_its_place_in_its_lane_at_its_tenants_turns(session, redis):
    from gpuq.db.tables import Job
    from gpuq.jobs.position import job_position

    def row(job_id: str, owner: str) -> Job:
        return Job(
            id=job_id, kind="generate", model=MODEL, priority=Priority.NORMAL, status="queued", request_hash="h",
            request={}, owner=owner,
        )  # fmt: skip

    session.add_all([row(f"a{i}", "alice") for i in range(3)] + [row(f"b{i}", "bob") for i in range(3)])
    session.commit()
    enqueue_jobs(redis, [entry(f"a{i}", lane=W1) for i in range(3)], timeout_s=60)
    enqueue_jobs(redis, [entry(f"b{i}", "bob") for i in range(3)], timeout_s=60)

    third = job_position(session, redis, session.get_one(Job, "a2"))

    assert third.queue == f"{NORMAL}:alice@{W1}"
    assert (third.ahead_in_queue, third.position) == (2 + 2, 4)  # its lane's 2, and bob's 2 at their turns
