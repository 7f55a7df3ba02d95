"""API keys and owners; where jobs ran and what energy they used; GPU telemetry history

Revision ID: 0006_access_and_stats
Revises: 0005_webhooks
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpuq.db.tables import UTCDateTime

revision = "0006_access_and_stats"
down_revision = "0005_webhooks"
branch_labels = None
depends_on = None

_OWNED = ("files", "batches", "schedules", "webhook_deliveries")


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("key_prefix", sa.String(16), nullable=False),
        sa.Column("max_queued_jobs", sa.Integer(), nullable=True),
        sa.Column("max_submissions_per_minute", sa.Integer(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("last_used_at", UTCDateTime(), nullable=True),
        sa.Column("revoked_at", UTCDateTime(), nullable=True),
    )
    with op.batch_alter_table("jobs") as jobs:
        jobs.add_column(sa.Column("host", sa.String(255), nullable=True))
        jobs.add_column(sa.Column("gpu_uuid", sa.String(96), nullable=True))
        jobs.add_column(sa.Column("owner", sa.String(128), nullable=True))
        jobs.add_column(sa.Column("api_key_id", sa.String(40), nullable=True))
        jobs.add_column(sa.Column("gpu_seconds", sa.Float(), nullable=True))
        jobs.add_column(sa.Column("energy_j", sa.Float(), nullable=True))
    _drop_global_idempotency_unique()
    op.create_index("uq_jobs_owner_idempotency_key", "jobs", ["owner", "idempotency_key"], unique=True)
    op.create_index("ix_jobs_owner_created", "jobs", ["owner", "created_at"])
    op.create_index("ix_jobs_key_status", "jobs", ["api_key_id", "status"])
    op.create_index("ix_jobs_finished", "jobs", ["finished_at"])
    for table in _OWNED:
        with op.batch_alter_table(table) as t:
            t.add_column(sa.Column("owner", sa.String(128), nullable=True))
    op.create_index("ix_batches_owner_created", "batches", ["owner", "created_at"])
    op.create_table(
        "gpu_samples",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("gpu_uuid", sa.String(96), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("sampled_at", UTCDateTime(), nullable=False),
        sa.Column("utilization_pct", sa.Float(), nullable=True),
        sa.Column("memory_used_mib", sa.Integer(), nullable=True),
        sa.Column("memory_total_mib", sa.Integer(), nullable=True),
        sa.Column("temperature_c", sa.Float(), nullable=True),
        sa.Column("power_w", sa.Float(), nullable=True),
    )
    op.create_index("ix_gpu_samples_gpu_time", "gpu_samples", ["gpu_uuid", "sampled_at"])
    op.create_index("ix_gpu_samples_time", "gpu_samples", ["sampled_at"])


# 0001 declared the column unique without naming the constraint: PostgreSQL named it
# itself; on SQLite batch mode reflects it and names it by this convention.
_SQLITE_NAMES = {"uq": "uq_%(table_name)s_%(column_0_name)s"}


def _drop_global_idempotency_unique() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_constraint("jobs_idempotency_key_key", "jobs", type_="unique")
        return
    with op.batch_alter_table("jobs", naming_convention=_SQLITE_NAMES) as jobs:
        jobs.drop_constraint("uq_jobs_idempotency_key", type_="unique")


def _restore_global_idempotency_unique() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.create_unique_constraint("jobs_idempotency_key_key", "jobs", ["idempotency_key"])
        return
    with op.batch_alter_table("jobs", naming_convention=_SQLITE_NAMES) as jobs:
        jobs.create_unique_constraint("uq_jobs_idempotency_key", ["idempotency_key"])


def downgrade() -> None:
    op.drop_table("gpu_samples")
    op.drop_index("ix_batches_owner_created", "batches")
    for table in _OWNED:
        with op.batch_alter_table(table) as t:
            t.drop_column("owner")
    op.drop_index("ix_jobs_finished", "jobs")
    op.drop_index("ix_jobs_key_status", "jobs")
    op.drop_index("ix_jobs_owner_created", "jobs")
    op.drop_index("uq_jobs_owner_idempotency_key", "jobs")
    _restore_global_idempotency_unique()
    with op.batch_alter_table("jobs") as jobs:
        for column in ("energy_j", "gpu_seconds", "api_key_id", "owner", "gpu_uuid", "host"):
            jobs.drop_column(column)
    op.drop_table("api_keys")
