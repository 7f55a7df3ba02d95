"""Model aliases: another name for a registered model, for clients that insist on one

Revision ID: 0019_model_aliases
Revises: 0018_prompt_ids
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpuq.db.tables import UTCDateTime

revision = "0019_model_aliases"
down_revision = "0018_prompt_ids"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "model_aliases",
        sa.Column("alias", sa.String(128), primary_key=True),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
    )
    op.create_index("ix_model_aliases_model", "model_aliases", ["model"])


def downgrade() -> None:
    op.drop_index("ix_model_aliases_model", table_name="model_aliases")
    op.drop_table("model_aliases")
