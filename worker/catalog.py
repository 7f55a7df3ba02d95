"""What this worker serves: the models and kinds its GPU may run (affinity rules) and can
run (memory), read from SQL every few seconds.

Re-reading on the worker's queue refresh means a new model, a changed rule or a GPU an
admin marked unhealthy takes effect within seconds, without a restart. Looking a model
up per job from this copy also saves a SQL round trip on every job.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from gpuq import store
from gpuq.db.tables import JobKind, Model
from gpuq.fleet.affinity import GpuTarget, Rule, decide
from gpuq.fleet.snapshot import rule_of, target_of

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str
    path: str
    context_length: int
    vram_mib: int


@dataclass(frozen=True, slots=True)
class Slot:
    """The GPUs this worker is pinned to, as SQL's inventory describes them."""

    targets: tuple[GpuTarget, ...]
    healthy: bool

    @property
    def memory_total_mib(self) -> int:
        return sum(t.memory_total_mib for t in self.targets)


class ModelCatalog:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        gpu_uuids: tuple[str, ...] = (),
        only: list[str] | None = None,
        too_small: Callable[[], set[str]] = set,
    ) -> None:
        self._sessions = sessions
        self._gpu_uuids = gpu_uuids
        self._only = set(only) if only else None
        self._too_small = too_small
        self._models: dict[str, ModelInfo] = {}
        self.slot: Slot | None = None

    def refresh(self) -> list[tuple[str, str]]:
        """Re-read registry, rules and inventory; returns the (model, kind) pairs served."""
        with self._sessions() as session:
            models = [m for m in store.list_models(session) if self._only is None or m.name in self._only]
            rules = [rule_of(r) for r in store.list_rules(session)]
            self.slot = self._read_slot(session) if self._gpu_uuids else None
        self._models = {m.name: ModelInfo(m.name, m.path, m.context_length, m.vram_mib) for m in models}
        if self.slot is not None and not self.slot.healthy:
            log.warning("this worker's GPU is marked unhealthy: taking no jobs until an admin clears it")
            return []
        too_small = self._too_small()
        return sorted(pair for m in models if m.name not in too_small for pair in self._servable(m, rules))

    def get(self, name: str) -> ModelInfo | None:
        return self._models.get(name)

    def _read_slot(self, session: Session) -> Slot:
        rows = {g.uuid: g for g in store.list_gpus(session) if g.uuid in self._gpu_uuids}
        targets = tuple(
            target_of(rows[u]) if u in rows else GpuTarget(u, -1, "", socket.gethostname(), 0) for u in self._gpu_uuids
        )
        return Slot(targets, healthy=all(rows[u].healthy for u in rows))

    def _servable(self, model: Model, rules: list[Rule]) -> list[tuple[str, str]]:
        kinds = model.kinds
        slot = self.slot
        if slot is not None:
            memory = slot.memory_total_mib
            if memory and model.vram_mib > memory:
                return []
            largest = max(t.memory_total_mib for t in slot.targets)
            if len(slot.targets) > 1 and model.vram_mib <= largest:
                return []  # a group slot serves only models that need a group; single GPUs take the rest
            kinds = [k for k in kinds if all(decide(rules, model.name, k, t).allowed for t in slot.targets)]
        # A noop job exercises the dispatch path of a model; whoever serves the model serves it.
        return [(model.name, k) for k in kinds] + ([(model.name, JobKind.NOOP.value)] if kinds else [])
