"""Stats: a day watermark, latency histograms per tenant/host/GPU and model, hourly job and GPU-sample rollups

Revision ID: 0008_stats_finer_rollups
Revises: 0007_stats_rollups
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpuq.db.tables import UTCDateTime

revision = "0008_stats_finer_rollups"
down_revision = "0007_stats_rollups"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table("stats_rolled_days", sa.Column("day", UTCDateTime(), primary_key=True))
    op.create_table(
        "job_latency_dim_daily",
        # In this order, a query reads the days of one tenant (host, GPU) and model as one range.
        sa.Column("dim", sa.String(8), primary_key=True),
        sa.Column("value", sa.String(255), primary_key=True),
        sa.Column("model", sa.String(128), primary_key=True),
        sa.Column("day", UTCDateTime(), primary_key=True),
        sa.Column("metric", sa.String(8), primary_key=True),
        sa.Column("bin", sa.Integer(), primary_key=True),
        sa.Column("jobs", sa.Integer(), nullable=False),
    )
    op.create_table(
        "job_stats_hourly",
        sa.Column("hour", UTCDateTime(), primary_key=True),
        sa.Column("model", sa.String(128), primary_key=True),
        sa.Column("kind", sa.String(16), primary_key=True),
        sa.Column("priority", sa.Integer(), primary_key=True),
        sa.Column("status", sa.String(16), primary_key=True),
        sa.Column("jobs", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "gpu_samples_hourly",
        sa.Column("hour", UTCDateTime(), primary_key=True),
        sa.Column("gpu_uuid", sa.String(96), primary_key=True),
        sa.Column("host", sa.String(255), primary_key=True),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("utilization_sum", sa.Float(), nullable=False),
        sa.Column("utilization_n", sa.Integer(), nullable=False),
        sa.Column("memory_used_max", sa.Integer(), nullable=True),
        sa.Column("power_sum", sa.Float(), nullable=False),
        sa.Column("power_n", sa.Integer(), nullable=False),
        sa.Column("temperature_max", sa.Float(), nullable=True),
    )
    # The day rollups are derived data: empty them so that every table is rebuilt from the
    # same days on the next stats query (the watermark above now says what is rolled up).
    op.execute("DELETE FROM job_stats_daily")
    op.execute("DELETE FROM job_latency_daily")


def downgrade() -> None:
    op.drop_table("gpu_samples_hourly")
    op.drop_table("job_stats_hourly")
    op.drop_table("job_latency_dim_daily")
    op.drop_table("stats_rolled_days")
