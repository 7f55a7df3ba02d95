"""webhook deliveries; batches may name a webhook

Revision ID: 0005_webhooks
Revises: 0004_schedules
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpuq.db.tables import UTCDateTime

revision = "0005_webhooks"
down_revision = "0004_schedules"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("batches") as batch:
        batch.add_column(sa.Column("webhook_url", sa.Text(), nullable=True))
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("job_id", sa.String(40), nullable=True),
        sa.Column("batch_id", sa.String(40), nullable=True),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", UTCDateTime(), nullable=False),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("delivered_at", UTCDateTime(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
    )
    op.create_index("ix_webhook_deliveries_due", "webhook_deliveries", ["status", "next_attempt_at"])
    op.create_index("ix_webhook_deliveries_job", "webhook_deliveries", ["job_id"])
    op.create_index("ix_webhook_deliveries_batch", "webhook_deliveries", ["batch_id"])


def downgrade() -> None:
    op.drop_table("webhook_deliveries")
    with op.batch_alter_table("batches") as batch:
        batch.drop_column("webhook_url")
