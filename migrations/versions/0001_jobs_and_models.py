"""jobs and models

Revision ID: 0001_jobs_and_models
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpuq.db.tables import UTCDateTime

revision = "0001_jobs_and_models"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("can_generate", sa.Boolean(), nullable=False),
        sa.Column("can_embed", sa.Boolean(), nullable=False),
        sa.Column("context_length", sa.Integer(), nullable=False),
        sa.Column("context_length_trained", sa.Integer(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("architecture", sa.String(64), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("idempotency_key", sa.String(255), nullable=True, unique=True),
        sa.Column("request_hash", sa.String(64), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("completion_tokens", sa.Integer(), nullable=True),
        sa.Column("load_ms", sa.Integer(), nullable=True),
        sa.Column("run_ms", sa.Integer(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=True),
        sa.Column("finished_at", UTCDateTime(), nullable=True),
        sa.Column("cancel_requested_at", UTCDateTime(), nullable=True),
        sa.Column("worker", sa.String(255), nullable=True),
        sa.Column("device", sa.String(255), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
    )
    op.create_index("ix_jobs_status_priority_created", "jobs", ["status", "priority", "created_at"])
    op.create_index("ix_jobs_model_created", "jobs", ["model", "created_at"])
    op.create_index("ix_jobs_created", "jobs", ["created_at"])


def downgrade() -> None:
    op.drop_table("jobs")
    op.drop_table("models")
