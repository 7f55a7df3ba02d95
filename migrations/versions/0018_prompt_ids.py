"""Jobs: prompt_ids, the prompt's tokens as the API built them while counting them, so the
worker runs them without tokenising the prompt again (null once the job has run, for jobs
the API did not tokenise, and for jobs submitted before)

Revision ID: 0018_prompt_ids
Revises: 0017_job_runs
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018_prompt_ids"
down_revision = "0017_job_runs"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("prompt_ids", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("prompt_ids")
