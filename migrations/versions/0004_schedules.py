"""cron schedules and their runs

Revision ID: 0004_schedules
Revises: 0003_files_and_batches
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpuq.db.tables import UTCDateTime

revision = "0004_schedules"
down_revision = "0003_files_and_batches"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(128), nullable=False, unique=True),
        sa.Column("cron", sa.String(128), nullable=False),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("input_file_id", sa.String(40), nullable=True),
        sa.Column("requests", sa.JSON(), nullable=True),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("misfire", sa.String(16), nullable=False),
        sa.Column("next_fire_at", UTCDateTime(), nullable=False),
        sa.Column("last_fired_at", UTCDateTime(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
    )
    op.create_table(
        "schedule_runs",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("schedule_id", sa.Integer(), nullable=False),
        sa.Column("fire_time", UTCDateTime(), nullable=False),
        sa.Column("trigger", sa.String(16), nullable=False),
        sa.Column("batch_id", sa.String(40), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.UniqueConstraint("schedule_id", "fire_time", name="uq_schedule_runs_tick"),
    )


def downgrade() -> None:
    op.drop_table("schedule_runs")
    op.drop_table("schedules")
