"""The most samples a job may ask for: the most slots of a live worker serving its model, as
the workers publish them on their RQ hashes, else the configured slots."""

import json

from gpuq.fleet.sample_limit import SampleLimit
from gpuq.fleet.workers import LiveWorker, live_workers
from gpuq.redis_keys import GENERATES_FIELD, SLOTS_FIELD, rq_worker_key


def _worker(name: str, slots: int, generates: frozenset[str] | None) -> LiveWorker:
    return LiveWorker(
        name=name,
        host="h",
        slot="cpu",
        device="cpu",
        gpu_uuids=(),
        rq_state="idle",
        loaded_models=(),
        last_heartbeat=None,
        birth=None,
        jobs_done=0,
        drained_itself=False,
        drained_by_host=False,
        slots=slots,
        generates=generates,
    )


def test_the_most_slots_of_the_workers_serving_the_model_and_only_those():
    limit = SampleLimit(
        [_worker("a", 2, frozenset({"small"})), _worker("b", 16, frozenset({"big"})), _worker("c", 4, frozenset())],
        configured=8,
    )
    assert limit.most("small") == (2, True)
    assert limit.most("big") == (16, True)
    assert limit.most("unserved") == (8, False)  # no live worker serves it: the configured slots


def test_a_worker_that_does_not_say_what_it_serves_may_serve_anything():
    """One from before workers published it: refusing by it could refuse what it runs."""
    limit = SampleLimit([_worker("old", 6, None), _worker("new", 2, frozenset({"m"}))], configured=1)
    assert limit.most("m") == (6, True) and limit.most("other") == (6, True)


def test_the_configured_slots_follow_the_settings_default_for_the_fleets_devices():
    assert SampleLimit.of([], worker_slots=0, has_gpus=True).configured == 8
    assert SampleLimit.of([], worker_slots=0, has_gpus=False).configured == 4
    assert SampleLimit.of([], worker_slots=3, has_gpus=True).configured == 3


def test_what_a_worker_publishes_is_read_back(redis):
    """The fields as worker/worker.py writes them at its birth and when what it serves changes."""
    for name, fields in {
        "w.new": {SLOTS_FIELD: 2, GENERATES_FIELD: json.dumps(["a", "b"])},
        "w.old": {SLOTS_FIELD: 5},
        "w.odd": {SLOTS_FIELD: 3, GENERATES_FIELD: "not json"},
    }.items():
        redis.sadd("rq:workers", rq_worker_key(name))
        redis.hset(rq_worker_key(name), mapping={"state": "idle", **fields})
    seen = {w.name: (w.slots, w.generates) for w in live_workers(redis)}
    assert seen == {"w.new": (2, frozenset({"a", "b"})), "w.old": (5, None), "w.odd": (3, None)}
