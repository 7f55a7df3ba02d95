"""Jobs: a deadline (when the job is needed by: it orders a priority's jobs earliest first,
and a job the fleet cannot finish by it is refused), and its completion budget (max_tokens
times n: the most completion tokens it may generate), so the work waiting is summed without
reading each request's JSON

Revision ID: 0022_deadlines
Revises: 0021_cache_tiers
Create Date: 2026-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpuq.db.tables import UTCDateTime

revision = "0022_deadlines"
down_revision = "0021_cache_tiers"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("deadline", UTCDateTime(), nullable=True))
        batch.add_column(sa.Column("completion_budget", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("completion_budget")
        batch.drop_column("deadline")
