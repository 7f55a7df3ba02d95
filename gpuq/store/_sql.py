"""What the store's modules share."""

from __future__ import annotations

from sqlalchemy.orm import Session
from sqlalchemy.sql import Executable

# Conditional UPDATEs touch rows the session has not loaded; skipping the ORM's session
# synchronisation saves a large share of each call on the worker's hot path.
NO_SYNC = {"synchronize_session": False}


def commit_changed(session: Session, statement: Executable) -> bool:
    """Run a conditional UPDATE or DELETE and commit: True if it changed a row, that is, if
    this call won the race its condition decides."""
    changed = session.execute(statement).rowcount
    session.commit()
    return bool(changed)
