"""What the store's modules share."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session
from sqlalchemy.sql import Executable

# Conditional UPDATEs touch rows the session has not loaded; skipping the ORM's session
# synchronisation saves a large share of each call on the worker's hot path.
NO_SYNC = {"synchronize_session": False}


def rows_changed(session: Session, statement: Executable, params: dict[str, Any] | None = None) -> int:
    """Run an UPDATE or DELETE (without committing): the number of rows it matched."""
    # An UPDATE or DELETE gives a CursorResult, which has the row count; SQLAlchemy's
    # Session.execute is typed to return the Result it derives from.
    return cast(CursorResult[Any], session.execute(statement, params)).rowcount


def commit_changed(session: Session, statement: Executable) -> bool:
    """Run a conditional UPDATE or DELETE and commit: True if it changed a row, that is, if
    this call won the race its condition decides."""
    changed = rows_changed(session, statement)
    session.commit()
    return bool(changed)
