"""Whether the database answers, for readiness checks."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.orm import Session


def check_database(session: Session) -> None:
    """One round trip; raises what the driver raises when the database does not answer."""
    session.execute(text("SELECT 1"))
