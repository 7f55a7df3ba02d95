"""SQLite: ids of affinity rules, schedules and schedule runs are never reused (AUTOINCREMENT)

Without it SQLite hands a deleted row's id to the next insert when it was the
highest, so a script holding rule 2's id could delete a different rule 2, and a new schedule
could inherit a deleted one's run history (and its (schedule_id, fire_time) uniqueness,
which would skip its first runs). PostgreSQL's sequences never reuse ids: nothing to do there.

gpu_samples keeps plain rowids: no one names a sample by id, and it is the one large table.

Revision ID: 0010_sqlite_autoincrement
Revises: 0009_energy_share
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0010_sqlite_autoincrement"
down_revision = "0009_energy_share"
branch_labels = None
depends_on = None

TABLES = ("affinity_rules", "schedules", "schedule_runs")


def _recreate(autoincrement: bool) -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for table in TABLES:
        # SQLite cannot add AUTOINCREMENT to a table: batch mode copies it into a new one.
        # Copying the rows with their ids sets sqlite_sequence to the highest id kept.
        with op.batch_alter_table(table, recreate="always", table_kwargs={"sqlite_autoincrement": autoincrement}):
            pass


def upgrade() -> None:
    _recreate(True)


def downgrade() -> None:
    _recreate(False)
