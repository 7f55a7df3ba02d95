"""The job monitor: heartbeats while a job runs, and cancellation by command or by flag."""

import threading
import time

from gpuq.redis_keys import cancel_flag_key
from worker.monitor import JobMonitor


def test_a_cancel_flag_is_seen_with_the_next_heartbeat_when_the_command_was_missed(redis):
    beats = []
    monitor = JobMonitor(redis, heartbeat=lambda: beats.append(time.monotonic()), heartbeat_interval_s=0.1)
    monitor.start()
    try:
        cancel = monitor.begin("job_a")
        deadline = time.monotonic() + 30
        while len(beats) < 2 and time.monotonic() < deadline:  # a heartbeat every 0.1 s while it runs
            time.sleep(0.02)
        assert len(beats) >= 2 and not cancel.is_set()
        redis.set(cancel_flag_key("job_a"), 1)
        assert cancel.wait(timeout=30)
        monitor.end("job_a")
        idle_beats = len(beats)
        time.sleep(0.3)
        assert len(beats) == idle_beats  # no heartbeats of its own between jobs
    finally:
        monitor.stop()


def test_a_command_cancels_only_the_job_that_is_running(redis):
    monitor = JobMonitor(redis, heartbeat=lambda: None, heartbeat_interval_s=60)
    cancel = monitor.begin("job_b")
    assert not monitor.cancel("job_other") and not cancel.is_set()
    assert monitor.cancel("job_b") and cancel.is_set()
    monitor.end("job_b")
    assert not monitor.cancel("job_b")
    assert isinstance(cancel, threading.Event)
