"""worker_events: workers started, stopped, crashed (with the exit status or signal),
restarted, drained and undrained; GPUs marked unhealthy and cleared

Revision ID: 0016_worker_events
Revises: 0015_cached_tokens
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpuq.db.tables import UTCDateTime

revision = "0016_worker_events"
down_revision = "0015_cached_tokens"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "worker_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("host", sa.String(255), nullable=True),
        sa.Column("slot", sa.String(64), nullable=True),
        sa.Column("worker", sa.String(255), nullable=True),
        sa.Column("gpu_uuids", sa.Text(), nullable=False),
        sa.Column("exit_status", sa.Integer(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_worker_events_at", "worker_events", ["at"])
    op.create_index("ix_worker_events_slot", "worker_events", ["host", "slot", "kind"])


def downgrade() -> None:
    op.drop_table("worker_events")
