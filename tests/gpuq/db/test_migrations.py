"""The schema comes from Alembic alone, and the same migrations run on SQLite and PostgreSQL."""

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from gpuq.db import migrate
from gpuq.db.engine import sync_engine
from gpuq.db.tables import Base
from tests.conftest import both_databases


@both_databases
def test_upgrade_creates_exactly_the_tables_the_code_declares(empty_database_url):
    migrate.upgrade(empty_database_url)
    engine = sync_engine(empty_database_url)
    with engine.connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        tables = set(inspect(conn).get_table_names())
    engine.dispose()
    assert {"jobs", "models", "alembic_version"} <= tables
    assert diffs == []


@both_databases
def test_downgrade_to_base_removes_the_tables_and_upgrade_restores_them(empty_database_url):
    migrate.upgrade(empty_database_url)
    migrate.downgrade(empty_database_url, "base")
    engine = sync_engine(empty_database_url)
    assert set(inspect(engine).get_table_names()) == {"alembic_version"}
    migrate.upgrade(empty_database_url)
    assert {"jobs", "models"} <= set(inspect(engine).get_table_names())
    engine.dispose()


@both_databases
def test_0011_carries_existing_estimates_to_the_457_mib_cuda_overhead(empty_database_url):
    import importlib

    from sqlalchemy import text

    before = importlib.import_module("migrations.versions.0011_vram_per_gpu").down_revision
    migrate.upgrade(empty_database_url, before)
    engine = sync_engine(empty_database_url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO models (name, path, can_generate, can_embed, context_length, context_length_trained,"
                " size_bytes, architecture, vram_estimate_mib, created_at)"
                " VALUES ('old', '/m.gguf', true, false, 2048, 8192, 1, 'llama', 837, CURRENT_TIMESTAMP)"
            )
        )
    migrate.upgrade(empty_database_url, "0011_vram_per_gpu")
    with engine.connect() as conn:
        row = conn.execute(text("SELECT vram_estimate_mib, vram_per_gpu_mib FROM models")).one()
    assert tuple(row) == (837 + 201, None)
    migrate.downgrade(empty_database_url, before)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT vram_estimate_mib FROM models")).scalar_one() == 837
    engine.dispose()


@both_databases
def test_0024_gives_existing_schedules_the_24h_window_their_runs_always_had(empty_database_url):
    from sqlalchemy import text

    migrate.upgrade(empty_database_url, "0023_batch_plan")
    engine = sync_engine(empty_database_url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO schedules (name, cron, timezone, endpoint, priority, enabled, misfire, next_fire_at,"
                " created_at) VALUES ('nightly', '0 2 * * *', 'UTC', '/v1/chat/completions', 2, true, 'skip',"
                " CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
            )
        )
    migrate.upgrade(empty_database_url, "0024_schedule_window")
    with engine.begin() as conn:
        assert conn.execute(text("SELECT name, completion_window FROM schedules")).all() == [("nightly", "24h")]
        # The previous release's scheduler and API insert schedules without the column.
        conn.execute(
            text(
                "INSERT INTO schedules (name, cron, timezone, endpoint, priority, enabled, misfire, next_fire_at,"
                " created_at) VALUES ('older', '0 3 * * *', 'UTC', '/v1/chat/completions', 2, true, 'skip',"
                " CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
            )
        )
        assert conn.execute(text("SELECT completion_window FROM schedules WHERE name = 'older'")).scalar_one() == "24h"
    migrate.downgrade(empty_database_url, "0023_batch_plan")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT name FROM schedules ORDER BY name")).scalars().all() == ["nightly", "older"]
    engine.dispose()
