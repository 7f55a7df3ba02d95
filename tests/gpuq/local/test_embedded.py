"""`gpuq up`'s supervisor: how long a stop waits for it, and how soon it starts again after dying."""

from gpuq.local.embedded import RESTART_BACKOFF_MAX_S, SUPERVISOR_STOP_TIMEOUT_S, restart_delay_s
from worker.supervisor import DRAIN_TIMEOUT_S


def test_a_stop_waits_out_the_supervisors_whole_drain_before_killing_it():
    # Killing it sooner sends its workers their death signal while they finish their jobs.
    assert SUPERVISOR_STOP_TIMEOUT_S > DRAIN_TIMEOUT_S + 10


def test_the_restart_backoff_doubles_to_a_minute_and_never_overflows():
    assert [restart_delay_s(n) for n in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert restart_delay_s(10**6) == RESTART_BACKOFF_MAX_S  # a supervisor dying for days
