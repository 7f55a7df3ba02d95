"""Stats: daily rollups of finished jobs and their latency histograms; indexes for stats filters

Revision ID: 0007_stats_rollups
Revises: 0006_access_and_stats
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpuq.db.tables import UTCDateTime

revision = "0007_stats_rollups"
down_revision = "0006_access_and_stats"
branch_labels = None
depends_on = None


def _key_columns() -> list[sa.Column]:
    return [
        sa.Column("day", UTCDateTime(), primary_key=True),
        sa.Column("model", sa.String(128), primary_key=True),
        sa.Column("kind", sa.String(16), primary_key=True),
        sa.Column("priority", sa.Integer(), primary_key=True),
    ]


def upgrade() -> None:
    op.create_table(
        "job_stats_daily",
        *_key_columns(),
        sa.Column("owner", sa.String(128), primary_key=True),
        sa.Column("host", sa.String(255), primary_key=True),
        sa.Column("gpu_uuid", sa.String(96), primary_key=True),
        sa.Column("status", sa.String(16), primary_key=True),
        sa.Column("jobs", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("run_ms", sa.BigInteger(), nullable=False),
        sa.Column("generated_run_ms", sa.BigInteger(), nullable=False),
        sa.Column("gpu_seconds", sa.Float(), nullable=False),
        sa.Column("gpu_seconds_jobs", sa.Integer(), nullable=False),
        sa.Column("energy_j", sa.Float(), nullable=False),
        sa.Column("energy_jobs", sa.Integer(), nullable=False),
    )
    op.create_table(
        "job_latency_daily",
        *_key_columns(),
        sa.Column("metric", sa.String(8), primary_key=True),
        sa.Column("bin", sa.Integer(), primary_key=True),
        sa.Column("jobs", sa.Integer(), nullable=False),
    )
    op.create_index("ix_jobs_gpu_finished", "jobs", ["gpu_uuid", "finished_at"])
    op.create_index("ix_jobs_host_finished", "jobs", ["host", "finished_at"])
    op.create_index("ix_jobs_status_finished", "jobs", ["status", "finished_at"])


def downgrade() -> None:
    op.drop_index("ix_jobs_status_finished", "jobs")
    op.drop_index("ix_jobs_host_finished", "jobs")
    op.drop_index("ix_jobs_gpu_finished", "jobs")
    op.drop_table("job_latency_daily")
    op.drop_table("job_stats_daily")
