"""The model registry's rows: models, and the aliases clients may name them by."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuq.db.tables import Model, ModelAlias

# ---------------------------------------------------------------- models


def get_model(session: Session, name: str) -> Model | None:
    return session.get(Model, name)


def find_model(session: Session, name: str) -> Model | None:
    """The model a job names: registered under ``name``, or the one ``name`` is an alias of."""
    model = session.get(Model, name)
    if model is not None:
        return model
    alias = session.get(ModelAlias, name)
    return None if alias is None else session.get(Model, alias.model)


def list_models(session: Session) -> Sequence[Model]:
    return session.scalars(select(Model).order_by(Model.name)).all()


def save_model(session: Session, model: Model) -> Model:
    """Insert or replace a model's registration (re-registering updates path and kinds)."""
    merged = session.merge(model)
    session.commit()
    return merged


# ---------------------------------------------------------------- aliases


def get_alias(session: Session, alias: str) -> ModelAlias | None:
    return session.get(ModelAlias, alias)


def list_aliases(session: Session) -> Sequence[ModelAlias]:
    return session.scalars(select(ModelAlias).order_by(ModelAlias.alias)).all()


def save_alias(session: Session, alias: str, model: str) -> ModelAlias:
    """Point ``alias`` at ``model`` (a new alias, or one moved to another model)."""
    row = session.merge(ModelAlias(alias=alias, model=model))
    session.commit()
    return row


def delete_alias(session: Session, alias: str) -> bool:
    """False when there was no such alias."""
    row = session.get(ModelAlias, alias)
    if row is None:
        return False
    session.delete(row)
    session.commit()
    return True
