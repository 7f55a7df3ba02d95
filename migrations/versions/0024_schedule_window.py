"""Schedules: a completion window, that of each run's batch (its lines' deadline: the run's
start plus the window); 24h for schedules made before, the window every run had until now

Revision ID: 0024_schedule_window
Revises: 0023_batch_plan
Create Date: 2026-12-09
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024_schedule_window"
down_revision = "0023_batch_plan"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.add_column(sa.Column("completion_window", sa.String(16), nullable=False, server_default="24h"))


def downgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.drop_column("completion_window")
