"""Jobs: cached_tokens, the prompt tokens whose KV a generation took from the worker's cache
instead of evaluating them (null for jobs that ran before, and for embeddings)

Revision ID: 0015_cached_tokens
Revises: 0012_key_default_priority
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015_cached_tokens"
down_revision = "0012_key_default_priority"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("cached_tokens", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("cached_tokens")
