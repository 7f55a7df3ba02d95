"""Cron schedules with a clock the test controls: fire times, misfires, exactly once."""

import threading
from datetime import UTC, datetime, timedelta

import pytest
from redis import Redis

from gpuq import store
from gpuq.batches.schedules import check_cron, fire_due_schedules, fire_times, store_inline_requests, zone
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import Batch, Job, Schedule, ScheduleRun
from gpuq.errors import RequestError
from tests.api.test_deadlines_api import slow_history
from tests.conftest import both_databases

T0 = datetime(2026, 11, 30, 12, 0, 30, tzinfo=UTC)
LINE = {
    "custom_id": "a",
    "method": "POST",
    "url": "/v1/chat/completions",
    "body": {"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
}


def test_fire_times_follow_the_time_zone_across_a_dst_change():
    # Noon every day in Paris; clocks go back on 2026-10-25 (UTC+2 -> UTC+1).
    times = fire_times("0 12 * * *", "Europe/Paris", datetime(2026, 10, 23, 12, tzinfo=UTC), 3)
    assert [t.isoformat() for t in times] == [
        "2026-10-24T10:00:00+00:00",
        "2026-10-25T11:00:00+00:00",
        "2026-10-26T11:00:00+00:00",
    ]


@pytest.mark.parametrize("bad", ["61 * * * *", "* * *", "every minute", "* * * * * * * *"])
def test_impossible_cron_expressions_say_why(bad):
    with pytest.raises(RequestError) as caught:
        check_cron(bad)
    assert caught.value.status == 422 and f"invalid cron expression {bad!r}" in caught.value.message


@pytest.mark.parametrize("extra_fields", ["* * * * * *", "0 0 2 * * * 2030", "*/1 * * * * *"])
def test_seconds_and_years_fields_are_refused_so_a_schedule_cannot_fire_every_second(extra_fields):
    with pytest.raises(RequestError) as caught:
        check_cron(extra_fields)
    assert caught.value.status == 422 and "give five fields" in caught.value.message
    assert "no seconds or years field" in caught.value.message


@pytest.mark.parametrize("never", ["0 0 31 2 *", "0 0 30 2 *", "0 0 31 4,6,9,11 *"])
def test_an_expression_that_matches_no_date_is_refused(never):
    with pytest.raises(RequestError) as caught:
        check_cron(never)
    assert caught.value.status == 422 and f"cron expression {never!r} never fires" in caught.value.message


@pytest.mark.parametrize("good", ["@daily", "@hourly", "@weekly", "0 0 29 2 *", "0 0 L * *", "*/5 9-17 * * 1-5"])
def test_five_field_expressions_and_aliases_give_their_first_fire_time(good):
    assert check_cron(good, "Europe/Paris") > datetime.now(UTC)


def test_unknown_time_zones_are_refused():
    with pytest.raises(RequestError, match="unknown time zone 'Mars/Olympus'"):
        zone("Mars/Olympus")


def make_schedule(
    session, tmp_path, *, misfire="skip", next_fire_at=T0 - timedelta(seconds=30), cron="* * * * *", **fields
):
    file = store.save_file(session, store_inline_requests([LINE], tmp_path))
    schedule = Schedule(
        **fields,
        name=f"s-{misfire}",
        cron=cron,
        timezone="UTC",
        input_file_id=file.id,
        requests=[LINE],
        endpoint="/v1/chat/completions",
        priority=2,
        enabled=True,
        misfire=misfire,
        next_fire_at=next_fire_at,
        created_at=T0,
    )
    return store.save_schedule(session, schedule)


@both_databases
def test_a_due_tick_fires_once_and_the_next_one_is_planned(session, redis, tmp_path):
    schedule = make_schedule(session, tmp_path)
    [run] = fire_due_schedules(session, redis, now=T0)
    assert run.fire_time == T0.replace(second=0) and run.trigger == "cron" and run.batch_id
    assert store.get_batch(session, run.batch_id).batch_metadata["schedule"] == "s-skip"
    assert fire_due_schedules(session, redis, now=T0 + timedelta(seconds=10)) == []  # same minute: nothing
    session.refresh(schedule)
    assert schedule.next_fire_at == datetime(2026, 11, 30, 12, 1, tzinfo=UTC)
    [later] = fire_due_schedules(session, redis, now=T0 + timedelta(seconds=35))
    assert later.fire_time == datetime(2026, 11, 30, 12, 1, tzinfo=UTC)


@both_databases
def test_missed_ticks_are_skipped_or_caught_up_once(session, redis, tmp_path):
    # Hourly; no scheduler ran from 09:00 until 12:05, so 09:00 ... 12:00 were all missed.
    hours_ago = datetime(2026, 11, 30, 9, tzinfo=UTC)
    make_schedule(session, tmp_path, misfire="skip", next_fire_at=hours_ago, cron="0 * * * *")
    caught = make_schedule(session, tmp_path, misfire="run_once", next_fire_at=hours_ago, cron="0 * * * *")
    runs = fire_due_schedules(session, redis, now=datetime(2026, 11, 30, 12, 5, tzinfo=UTC))
    assert [(r.schedule_id, r.trigger, r.fire_time.hour) for r in runs] == [(caught.id, "catch-up", 12)]


@both_databases
def test_two_schedulers_on_the_same_tick_fire_it_exactly_once(session, database_url, redis_url, tmp_path):
    make_schedule(session, tmp_path)
    engine = sync_engine(database_url)
    barrier = threading.Barrier(2)
    results = []

    def scheduler():
        with sync_sessions(engine)() as own, Redis.from_url(redis_url) as redis:
            barrier.wait()
            results.append(len(fire_due_schedules(own, redis, now=T0)))

    threads = [threading.Thread(target=scheduler) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    engine.dispose()
    assert sorted(results) == [0, 1]
    session.expire_all()
    assert len(session.query(ScheduleRun).all()) == 1


def test_a_run_whose_batch_cannot_start_records_why(session, redis, tmp_path):
    schedule = make_schedule(session, tmp_path)
    schedule.input_file_id = "file-gone"  # its input file was deleted since
    session.commit()
    [run] = fire_due_schedules(session, redis, now=T0)
    assert run.batch_id is None and run.error == "file 'file-gone' does not exist"
    assert schedule.id == run.schedule_id


@both_databases
@pytest.mark.parametrize("cron", ["* * * * * *", "0 0 31 2 *"])
def test_a_schedule_stored_with_a_cron_now_refused_is_paused_instead_of_fired(session, redis, tmp_path, cron, caplog):
    schedule = make_schedule(session, tmp_path, cron=cron, next_fire_at=T0 - timedelta(seconds=1))
    assert fire_due_schedules(session, redis, now=T0) == []
    session.refresh(schedule)
    assert schedule.enabled is False and session.query(ScheduleRun).count() == 0
    assert f"schedule {schedule.name} is paused" in caplog.text


def test_a_cron_run_s_batch_is_planned_like_any_other(session, redis, tmp_path):
    """Cron runs start their batch in the one place batches start, so their lines are planned
    too, for the slots the scheduler's settings give (no worker is up)."""
    from gpuq.batches.queue_order import Planning

    start = "".join(f"Fact {i} is here. " for i in range(20))
    lines = [
        LINE | {"custom_id": f"l{i}", "body": LINE["body"] | {"messages": [{"role": "user", "content": f"{start}{i}"}]}}
        for i in range(3)
    ]
    file = store.save_file(session, store_inline_requests(lines, tmp_path))
    schedule = make_schedule(session, tmp_path)
    schedule.input_file_id = file.id
    store.save_schedule(session, schedule)
    [run] = fire_due_schedules(session, redis, now=T0, planning=Planning(cpu_slots=2))
    batch = store.get_batch(session, run.batch_id)
    assert (batch.planned_lines, batch.planned_groups, batch.planned_slots) == (3, 1, 2)
    [off] = fire_due_schedules(session, redis, now=T0 + timedelta(seconds=35), planning=Planning(enabled=False))
    assert store.get_batch(session, off.batch_id).planned_lines is None


@both_databases
def test_a_run_s_batch_has_its_schedule_s_completion_window_and_its_lines_that_deadline(session, redis, tmp_path):
    six_hours = make_schedule(session, tmp_path, completion_window="6h")
    before = datetime.now(UTC)
    [run] = fire_due_schedules(session, redis, now=T0)
    batch = store.get_batch(session, run.batch_id)
    assert run.schedule_id == six_hours.id and batch.completion_window == "6h"
    assert batch.expires_at - batch.created_at == timedelta(hours=6) and batch.created_at >= before
    lines = session.query(Job).filter(Job.batch_id == batch.id).all()
    assert len(lines) == 1 and all(j.deadline == batch.expires_at for j in lines)


def test_a_schedule_given_no_window_runs_its_batches_in_24_hours(session, redis, tmp_path):
    plain = make_schedule(session, tmp_path)
    assert plain.completion_window == "24h"
    [run] = fire_due_schedules(session, redis, now=T0)
    batch = store.get_batch(session, run.batch_id)
    assert batch.completion_window == "24h" and batch.expires_at - batch.created_at == timedelta(hours=24)


@both_databases
def test_a_run_the_fleet_cannot_finish_in_its_window_records_the_refusal_and_the_schedule_goes_on(
    session, redis, tmp_path
):
    slow_history(session)  # 0.6 tokens/s lately: three lines of 2000 max_tokens need about 5000 s
    long_lines = [LINE | {"custom_id": f"l{i}", "body": LINE["body"] | {"max_tokens": 2000}} for i in range(3)]
    file = store.save_file(session, store_inline_requests(long_lines, tmp_path))
    schedule = make_schedule(session, tmp_path, completion_window="1h")
    schedule.input_file_id = file.id
    store.save_schedule(session, schedule)
    jobs_before = session.query(Job).count()

    [run] = fire_due_schedules(session, redis, now=T0)

    assert run.batch_id is None and "the batch cannot be done by its deadline" in (run.error or "")
    session.expire_all()
    assert session.query(Batch).count() == 0 and session.query(Job).count() == jobs_before
    [recorded] = session.query(ScheduleRun).all()
    assert recorded.error == run.error and recorded.batch_id is None
    assert schedule.next_fire_at == datetime(2026, 11, 30, 12, 1, tzinfo=UTC)  # its next tick is planned
    schedule.completion_window = "24h"  # time enough: the next tick's run starts its batch
    store.save_schedule(session, schedule)
    [later] = fire_due_schedules(session, redis, now=T0 + timedelta(seconds=35))
    assert later.batch_id and later.error is None
