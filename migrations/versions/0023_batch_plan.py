"""Batches: what planning their queue order did (generation lines planned, the starts they
share, the workers' slots it was planned for)

Revision ID: 0023_batch_plan
Revises: 0022_deadlines
Create Date: 2026-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023_batch_plan"
down_revision = "0022_deadlines"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("batches") as batch:
        batch.add_column(sa.Column("planned_lines", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("planned_groups", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("planned_slots", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("batches") as batch:
        batch.drop_column("planned_slots")
        batch.drop_column("planned_groups")
        batch.drop_column("planned_lines")
