"""Integer ids are never handed out twice, on either database: a script that holds a deleted
row's id must not reach a newer row through it (migration 0010 makes SQLite's AUTOINCREMENT)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import inspect, text

from gpuq import store
from gpuq.db import migrate
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import AffinityRule, Schedule, ScheduleRun
from tests.conftest import both_databases

TICK = datetime(2026, 12, 1, 2, 0, tzinfo=UTC)


def _rule(pattern: str) -> AffinityRule:
    return AffinityRule(model_pattern=pattern, effect="allow", precedence=0)


def _schedule(name: str) -> Schedule:
    return Schedule(
        name=name,
        cron="0 2 * * *",
        timezone="UTC",
        endpoint="/v1/embeddings",
        priority=2,
        misfire="skip",
        next_fire_at=TICK + timedelta(days=1),
    )


@both_databases
def test_the_newest_rules_id_is_not_given_again_after_it_is_deleted(session):
    first, second = store.save_rule(session, _rule("a-*")), store.save_rule(session, _rule("b-*"))
    deleted = second.id
    assert store.delete_rule(session, deleted)
    newer = store.save_rule(session, _rule("c-*"))
    assert newer.id > deleted
    # The script still holding the deleted id deletes nothing, and the newer rule stays.
    assert not store.delete_rule(session, deleted)
    assert [r.id for r in store.list_rules(session)] == sorted([first.id, newer.id])


@both_databases
def test_a_new_schedule_inherits_no_run_of_a_deleted_one(session):
    old = store.save_schedule(session, _schedule("nightly"))
    assert store.claim_schedule_run(session, ScheduleRun(schedule_id=old.id, fire_time=TICK, trigger="cron"))
    assert store.delete_schedule(session, old.id)

    new = store.save_schedule(session, _schedule("nightly-v2"))
    assert new.id != old.id
    assert store.schedule_runs(session, new.id, limit=10) == []
    # Its own run at the same tick is not taken for one already fired.
    assert store.claim_schedule_run(session, ScheduleRun(schedule_id=new.id, fire_time=TICK, trigger="cron"))


def test_upgrading_an_sqlite_database_keeps_its_ids_and_counts_on_from_the_highest(empty_database_url):
    migrate.upgrade(empty_database_url, "0009_energy_share")
    engine = sync_engine(empty_database_url)
    with engine.begin() as conn:
        for rule_id in (1, 2, 7):
            conn.execute(
                text(
                    "INSERT INTO affinity_rules (id, model_pattern, effect, precedence, created_at) "
                    "VALUES (:id, :pattern, 'allow', 0, '2026-12-01 00:00:00.000000')"
                ),
                {"id": rule_id, "pattern": f"m{rule_id}-*"},
            )
    engine.dispose()

    migrate.upgrade(empty_database_url)
    engine = sync_engine(empty_database_url)
    with sync_sessions(engine)() as session:
        assert [(r.id, r.model_pattern) for r in store.list_rules(session)] == [(1, "m1-*"), (2, "m2-*"), (7, "m7-*")]
        assert store.delete_rule(session, 7)
        assert store.save_rule(session, _rule("after-*")).id == 8
    with engine.connect() as conn:
        for table in ("affinity_rules", "schedules", "schedule_runs"):
            ddl = conn.execute(text("SELECT sql FROM sqlite_master WHERE name = :t"), {"t": table}).scalar_one()
            assert "AUTOINCREMENT" in ddl, table
        # The copy kept the constraints: a schedule's name is unique, a run unique per tick.
        assert {tuple(u["column_names"]) for u in inspect(conn).get_unique_constraints("schedule_runs")} == {
            ("schedule_id", "fire_time")
        }
        assert {tuple(u["column_names"]) for u in inspect(conn).get_unique_constraints("schedules")} == {("name",)}
    engine.dispose()
