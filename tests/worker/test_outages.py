"""The worker's backoff while Redis or the database is down: capped however long the outage."""

from worker.outages import BACKOFF_MAX_S, Dependency, backoff_s


def test_a_streak_of_any_length_waits_at_most_the_cap_and_never_overflows():
    assert [backoff_s(n) for n in (1, 2, 3)] == [1.0, 2.0, 4.0]
    dependency = Dependency("Redis", meanwhile="waiting")
    for _ in range(2000):  # 2 ** 1024 overflowed a float after 1,025 failures
        dependency.failed("testing", RuntimeError("down"))
    assert 0 < dependency.wait_s <= BACKOFF_MAX_S
    assert backoff_s(10**9) == BACKOFF_MAX_S
