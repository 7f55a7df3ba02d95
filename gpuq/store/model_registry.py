"""The model registry's rows."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuq.db.tables import (
    Model,
)

# ---------------------------------------------------------------- models


def get_model(session: Session, name: str) -> Model | None:
    return session.get(Model, name)


def list_models(session: Session) -> Sequence[Model]:
    return session.scalars(select(Model).order_by(Model.name)).all()


def save_model(session: Session, model: Model) -> Model:
    """Insert or replace a model's registration (re-registering updates path and kinds)."""
    merged = session.merge(model)
    session.commit()
    return merged
