"""Job runs: every run of a job (its claim, worker, start, end, outcome, and whether its
attempt was refunded), so a job run again after its worker died shows both runs

Revision ID: 0017_job_runs
Revises: 0015_cached_tokens
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpuq.db.tables import UTCDateTime

revision = "0017_job_runs"
down_revision = "0015_cached_tokens"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_runs",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(40), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(255), nullable=False),
        sa.Column("host", sa.String(255), nullable=True),
        sa.Column("device", sa.String(255), nullable=True),
        sa.Column("started_at", UTCDateTime(), nullable=False),
        sa.Column("ended_at", UTCDateTime(), nullable=True),
        sa.Column("outcome", sa.String(16), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("refunded", sa.Boolean(), nullable=False),
    )
    op.create_index("ix_job_runs_job", "job_runs", ["job_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_job_runs_job", table_name="job_runs")
    op.drop_table("job_runs")
