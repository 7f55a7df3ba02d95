"""API keys: weight, the share of the fleet its tenant's jobs get beside other tenants' of the
same priority (a tenant weighs as its heaviest active key; 1 for keys made before)

Revision ID: 0020_fairness
Revises: 0019_model_aliases
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020_fairness"
down_revision = "0019_model_aliases"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("weight", sa.Integer(), nullable=False, server_default="1"))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("weight")
