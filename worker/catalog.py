"""What this worker serves: the models and kinds its GPU may run (affinity rules) and can
run (memory, health), read from SQL every few seconds.

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
from gpuq.fleet.placement import Candidate, FitsMemoryFilter, PlacementRequest, evaluate, may_serve
from gpuq.fleet.snapshot import request_of, rule_of, target_of

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str
    path: str
    context_length: int
    vram_mib: int  # on this worker's GPUs (a group pays the per-GPU part once per GPU)
    per_gpu_mib: int | None = None


@dataclass(frozen=True, slots=True)
class Slot:
    """The GPUs this worker is pinned to, as SQL's inventory describes them."""

    targets: tuple[GpuTarget, ...]
    healthy: bool
    share: int = 1  # workers sharing these GPUs (the supervisor's --slots-per-gpu)

    @property
    def memory_total_mib(self) -> int:
        return sum(t.memory_total_mib for t in self.targets)

    @property
    def budget_mib(self) -> int:
        """What this worker's model cache may hold: its share of the GPUs' memory."""
        return self.memory_total_mib // self.share


class ModelCatalog:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        gpu_uuids: tuple[str, ...] = (),
        only: list[str] | None = None,
        skip: Callable[[], set[str]] = set,
        gpu_share: int = 1,
    ) -> None:
        self._sessions = sessions
        self._gpu_uuids = gpu_uuids
        self._only = set(only) if only else None
        self._skip = skip  # models marked too small here, or stepped back from (worker/faults.py)
        self._gpu_share = gpu_share
        self._models: dict[str, ModelInfo] = {}
        self.slot: Slot | None = None

    def refresh(self) -> list[tuple[str, str]]:
        """Re-read registry, rules and inventory; returns the (model, kind) pairs served."""
        with self._sessions() as session:
            models = [m for m in store.list_models(session) if self._only is None or m.name in self._only]
            rules = [rule_of(r) for r in store.list_rules(session)]
            self.slot = self._read_slot(session) if self._gpu_uuids else None
        n_gpus = len(self._gpu_uuids) or 1
        self._models = {
            m.name: ModelInfo(m.name, m.path, m.context_length, request_of(m, "").vram_on(n_gpus), m.vram_per_gpu_mib)
            for m in models
        }
        if self.slot is not None and not self.slot.healthy:
            log.warning("this worker's GPU is marked unhealthy: taking no jobs until an admin clears it")
            return []
        skip = self._skip()
        return sorted(pair for m in models if m.name not in skip for pair in self._servable(m, rules))

    def get(self, name: str) -> ModelInfo | None:
        return self._models.get(name)

    def _read_slot(self, session: Session) -> Slot:
        rows = {g.uuid: g for g in store.list_gpus(session) if g.uuid in self._gpu_uuids}
        targets = tuple(
            target_of(rows[u]) if u in rows else GpuTarget(u, -1, "", socket.gethostname(), 0) for u in self._gpu_uuids
        )
        return Slot(targets, healthy=all(rows[u].healthy for u in rows), share=self._gpu_share)

    def _servable(self, model: Model, rules: list[Rule]) -> list[tuple[str, str]]:
        kinds = model.kinds
        if self.slot is not None:
            kinds = [k for k in kinds if self._may_run(request_of(model, k), rules, self.slot)]
        # A noop job exercises the dispatch path of a model; whoever serves the model serves it.
        return [(model.name, k) for k in kinds] + ([(model.name, JobKind.NOOP.value)] if kinds else [])

    @staticmethod
    def _may_run(request: PlacementRequest, rules: list[Rule], slot: Slot) -> bool:
        if len(slot.targets) == 1:
            target = slot.targets[0]
            # A GPU SQL does not know yet (memory 0) is not judged on memory: the supervisor records it soon.
            filters = [f for f in may_serve(rules) if target.memory_total_mib or not isinstance(f, FitsMemoryFilter)]
            return evaluate(request, [Candidate(target, None, slot.healthy)], filters)[0].ok
        # A group slot serves only models that need a group; single GPUs take the rest.
        largest = max(t.memory_total_mib for t in slot.targets)
        if request.vram_mib <= largest:
            return False
        if slot.memory_total_mib and request.vram_on(len(slot.targets)) > slot.memory_total_mib:
            return False
        return all(decide(rules, request.model, request.kind, t).allowed for t in slot.targets)
