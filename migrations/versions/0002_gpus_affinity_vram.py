"""GPU inventory, affinity rules, and VRAM figures on models

Revision ID: 0002_gpus_affinity_vram
Revises: 0001_jobs_and_models
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpuq.db.tables import UTCDateTime

revision = "0002_gpus_affinity_vram"
down_revision = "0001_jobs_and_models"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("vram_estimate_mib", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("vram_override_mib", sa.Integer(), nullable=True))
    op.create_table(
        "gpus",
        sa.Column("uuid", sa.String(96), primary_key=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("memory_total_mib", sa.Integer(), nullable=False),
        sa.Column("simulated", sa.Boolean(), nullable=False),
        sa.Column("healthy", sa.Boolean(), nullable=False),
        sa.Column("unhealthy_reason", sa.Text(), nullable=True),
        sa.Column("first_seen", UTCDateTime(), nullable=False),
        sa.Column("last_seen", UTCDateTime(), nullable=False),
    )
    op.create_table(
        "affinity_rules",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("model_pattern", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(16), nullable=True),
        sa.Column("effect", sa.String(8), nullable=False),
        sa.Column("precedence", sa.Integer(), nullable=False),
        sa.Column("gpu_indices", sa.JSON(), nullable=True),
        sa.Column("gpu_uuids", sa.JSON(), nullable=True),
        sa.Column("gpu_name_pattern", sa.String(255), nullable=True),
        sa.Column("host_pattern", sa.String(255), nullable=True),
        sa.Column("min_memory_mib", sa.Integer(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("affinity_rules")
    op.drop_table("gpus")
    with op.batch_alter_table("models") as batch:
        batch.drop_column("vram_override_mib")
        batch.drop_column("vram_estimate_mib")
