"""Priority aging on a real Redis: waiting jobs climb one priority per `aging_s`, in order."""

from datetime import timedelta

from rq.job import Job as RQJob

from gpuq.db.tables import utcnow
from gpuq.jobs.aging import promote_aged_jobs
from gpuq.jobs.enqueue import enqueue_jobs
from gpuq.queue_names import Priority, QueueEntry


def queue(redis, priority: str) -> list[str]:
    return [x.decode() for x in redis.lrange(f"rq:queue:gpuq:m:generate:{priority}", 0, -1)]


def test_old_jobs_move_up_one_level_per_interval_keeping_their_order(redis):
    enqueue_jobs(redis, [QueueEntry(f"low{i}", "m", "generate", Priority.LOW) for i in range(3)], timeout_s=60)
    enqueue_jobs(redis, [QueueEntry("high0", "m", "generate", Priority.HIGH)], timeout_s=60)
    now = utcnow()

    assert promote_aged_jobs(redis, aging_s=60, now=now) == []  # nobody waited a minute yet
    later = now + timedelta(seconds=61)
    assert sorted(promote_aged_jobs(redis, aging_s=60, now=later)) == ["low0", "low1", "low2"]
    assert queue(redis, "low") == [] and queue(redis, "normal") == ["low0", "low1", "low2"]
    assert RQJob.fetch("low0", connection=redis).origin == "gpuq:m:generate:normal"

    # One interval in normal is not yet over (their clock restarted when they moved up).
    assert promote_aged_jobs(redis, aging_s=60, now=later + timedelta(seconds=30)) == []
    promote_aged_jobs(redis, aging_s=60, now=later + timedelta(seconds=61))
    # At the front of high, oldest first, ahead of the fresh high job.
    assert queue(redis, "high") == ["low0", "low1", "low2", "high0"]


def test_aging_can_be_turned_off(redis):
    enqueue_jobs(redis, [QueueEntry("j", "m", "generate", Priority.LOW)], timeout_s=60)
    assert promote_aged_jobs(redis, aging_s=0, now=utcnow() + timedelta(days=1)) == []
    assert queue(redis, "low") == ["j"]


def test_a_job_taken_by_a_worker_meanwhile_is_not_moved(redis):
    enqueue_jobs(redis, [QueueEntry("j", "m", "generate", Priority.LOW)], timeout_s=60)
    redis.lpop("rq:queue:gpuq:m:generate:low")  # a worker took it
    assert promote_aged_jobs(redis, aging_s=1, now=utcnow() + timedelta(seconds=5)) == []
    assert queue(redis, "normal") == []
