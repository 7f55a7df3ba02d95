"""Upgrades with running workers (docs/operations.md) rely on every migration being additive:
the previous release's API, scheduler and workers keep working on the migrated schema until
they are restarted. So a revision's upgrade() may create tables, indexes and columns that are
nullable or have a server default, and may not drop, rename or alter what exists (that waits
for a later release, once no old process is left)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

VERSIONS = Path(__file__).parents[3] / "migrations" / "versions"
BREAKING = {"drop_column", "drop_table", "alter_column", "rename_table", "drop_constraint"}


def problems(source: str) -> list[str]:
    """What in a revision's upgrade() would break the previous release's processes."""
    found = []
    for function in ast.parse(source).body:
        if not (isinstance(function, ast.FunctionDef) and function.name == "upgrade"):
            continue
        for node in ast.walk(function):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr in BREAKING:
                found.append(f"{node.func.attr}: {ast.unparse(node)}")
            if node.func.attr == "add_column" and node.args:
                column = node.args[0]
                keywords = {k.arg: k.value for k in getattr(column, "keywords", [])}
                nullable = keywords.get("nullable")
                required = isinstance(nullable, ast.Constant) and nullable.value is False
                if required and "server_default" not in keywords:
                    found.append(f"a NOT NULL column without a server default: {ast.unparse(column)}")
    return found


@pytest.mark.parametrize("revision", sorted(VERSIONS.glob("0*.py")), ids=lambda p: p.stem)
def test_each_migration_only_adds(revision):
    assert problems(revision.read_text()) == []


def test_the_check_finds_drops_renames_and_required_columns_without_a_default():
    source = """
def upgrade():
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("tenant", sa.String(40), nullable=False))
        batch.add_column(sa.Column("fine", sa.Integer(), nullable=False, server_default="0"))
        batch.drop_column("owner")
    op.rename_table("jobs", "tasks")

def downgrade():
    op.drop_table("tasks")
"""
    assert sorted(problems(source)) == [
        "a NOT NULL column without a server default: sa.Column('tenant', sa.String(40), nullable=False)",
        "drop_column: batch.drop_column('owner')",
        "rename_table: op.rename_table('jobs', 'tasks')",
    ]  # and nothing from downgrade(), where dropping is the point
