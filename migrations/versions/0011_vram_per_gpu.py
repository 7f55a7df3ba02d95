"""Models: vram_per_gpu_mib, what each GPU of a group pays again (its compute buffer and CUDA
overhead); estimates carried from a 256 MiB to a 457 MiB CUDA overhead per GPU

Rows registered before have no per-GPU figure (a group then adds the CUDA overhead per
further GPU) until they are registered again; their estimate gains the 201 MiB of overhead
the old formula missed, so placement does not keep planning with the smaller figure.

Revision ID: 0011_vram_per_gpu
Revises: 0010_sqlite_autoincrement
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011_vram_per_gpu"
down_revision = "0010_sqlite_autoincrement"
branch_labels = None
depends_on = None

OVERHEAD_CHANGE_MIB = 457 - 256


def upgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("vram_per_gpu_mib", sa.Integer(), nullable=True))
    op.execute(sa.text(f"UPDATE models SET vram_estimate_mib = vram_estimate_mib + {OVERHEAD_CHANGE_MIB}"))


def downgrade() -> None:
    op.execute(sa.text(f"UPDATE models SET vram_estimate_mib = vram_estimate_mib - {OVERHEAD_CHANGE_MIB}"))
    with op.batch_alter_table("models") as batch:
        batch.drop_column("vram_per_gpu_mib")
