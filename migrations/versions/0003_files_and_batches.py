"""files and batches; jobs know their batch line

Revision ID: 0003_files_and_batches
Revises: 0002_gpus_affinity_vram
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpuq.db.tables import UTCDateTime

revision = "0003_files_and_batches"
down_revision = "0002_gpus_affinity_vram"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("batch_id", sa.String(40), nullable=True))
        batch.add_column(sa.Column("custom_id", sa.String(255), nullable=True))
        batch.add_column(sa.Column("line_count", sa.Integer(), nullable=False, server_default="1"))
        batch.add_column(sa.Column("line_number", sa.Integer(), nullable=True))
        batch.create_index("ix_jobs_batch_status", ["batch_id", "status"])
    op.create_table(
        "files",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("filename", sa.String(255), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("line_count", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
    )
    timestamps = ["in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at"]
    timestamps += ["cancelling_at", "cancelled_at"]
    op.create_table(
        "batches",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("input_file_id", sa.String(40), nullable=False),
        sa.Column("completion_window", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=True),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("output_file_id", sa.String(40), nullable=True),
        sa.Column("error_file_id", sa.String(40), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        *(sa.Column(name, UTCDateTime(), nullable=True) for name in timestamps),
    )
    op.create_index("ix_batches_status", "batches", ["status"])
    op.create_index("ix_batches_created", "batches", ["created_at"])


def downgrade() -> None:
    op.drop_table("batches")
    op.drop_table("files")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_batch_status")
        batch.drop_column("line_number")
        batch.drop_column("line_count")
        batch.drop_column("custom_id")
        batch.drop_column("batch_id")
