"""The worker's copy of the model registry, refreshed with its queue list.

Looking a model up in SQL for every job costs a round trip per job; registrations change
rarely, so the worker reads them every few seconds instead (when it refreshes the queues
it listens on) and a re-registered model is picked up within that interval.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from gpuq import store


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str
    path: str
    context_length: int


class ModelCatalog:
    def __init__(self, sessions: sessionmaker[Session], *, only: list[str] | None = None) -> None:
        self._sessions = sessions
        self._only = set(only) if only else None
        self._models: dict[str, ModelInfo] = {}

    def refresh(self) -> list[str]:
        """Re-read the registry; returns the names this worker serves, sorted."""
        with self._sessions() as session:
            rows = store.list_models(session)
        self._models = {
            m.name: ModelInfo(m.name, m.path, m.context_length)
            for m in rows
            if self._only is None or m.name in self._only
        }
        return sorted(self._models)

    def get(self, name: str) -> ModelInfo | None:
        return self._models.get(name)
