"""The admin's worker controls in Redis, and the states a worker is shown in."""

import pytest

from gpuq.fleet import workers
from gpuq.fleet.workers import LiveWorker, read_control
from worker.worker import slot_of


def _worker(**flags):
    base = dict(
        name="h.cpu.1.ab",
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
    )
    return LiveWorker(**(base | flags))


@pytest.mark.parametrize(
    ("flags", "job", "state"),
    [
        ({}, None, "idle"),
        ({}, "job_1", "busy"),
        ({"drained_itself": True}, "job_1", "draining"),
        ({"drained_by_host": True}, None, "drained"),
        ({"rq_state": "busy", "drained_itself": True}, None, "draining"),
    ],
)
def test_a_workers_state_combines_its_work_and_the_drain_flags(flags, job, state):
    assert _worker(**flags).state(job) == state


def test_the_slot_is_read_from_names_whose_host_has_dots():
    assert slot_of("gpu-box.example.com.gpu0-1.4242.beef") == "gpu0-1"
    assert slot_of("odd") == ""


def test_flags_reach_the_worker_and_a_dead_workers_hash_is_not_brought_back(redis):
    assert workers.set_worker_drain(redis, "gone", drained=True) is False
    assert redis.exists("rq:worker:gone") == 0  # no TTL-less husk left behind
    redis.hset("rq:worker:alive", mapping={"state": "idle"})
    assert workers.set_worker_drain(redis, "alive", drained=True)
    assert read_control(redis, worker_key="rq:worker:alive", worker_name="alive", host="h").drained
    assert workers.set_worker_drain(redis, "alive", drained=False)
    assert not read_control(redis, worker_key="rq:worker:alive", worker_name="alive", host="h").drained

    workers.set_host_drain(redis, "h", ["alive"], drained=True)
    workers.request_unload(redis, ["alive"], "m1")
    seen = read_control(redis, worker_key="rq:worker:alive", worker_name="alive", host="h")
    assert seen.drained and seen.unload == {"m1"}
    workers.unload_done(redis, "alive", ["m1"])
    assert read_control(redis, worker_key="rq:worker:alive", worker_name="alive", host="h").unload == frozenset()
    assert not read_control(redis, worker_key="rq:worker:other", worker_name="other", host="elsewhere").drained
