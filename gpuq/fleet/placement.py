"""Placement policy, in one place: a chain of filters over a snapshot of the fleet.

Each filter keeps a GPU or gives the reason it drops it, so the same chain answers "may
this job be queued at all" (the API), "which models may this GPU serve" (a worker) and
"where may model X run, and why" (the affinity preview), and a worker's "may I load it
now" (free memory, health). Pure and synchronous: callers gather the snapshot (rules, GPUs,
free memory) and pass it in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpuq.fleet.affinity import GpuTarget, Rule, decide
from gpuq.fleet.gpus import is_mig_uuid
from gpuq.fleet.vram import on_gpus


@dataclass(frozen=True, slots=True)
class Candidate:
    """One GPU as placement sees it."""

    target: GpuTarget
    memory_free_mib: int | None  # None: not known now (no live reading); never the total in its place
    healthy: bool = True
    loaded_models: frozenset[str] = frozenset()

    @property
    def is_mig(self) -> bool:
        """A MIG device: a CUDA process can use only one, so it never joins a group."""
        return is_mig_uuid(self.target.uuid)


@dataclass(frozen=True, slots=True)
class PlacementRequest:
    model: str
    kind: str
    vram_mib: int  # on one GPU
    vram_basis: str = ""  # what the figure counts (K sequences of n tokens, or an admin's measure), for people
    per_gpu_mib: int | None = None  # what each further GPU of a group pays again (None: the CUDA overhead)

    def vram_on(self, n_gpus: int) -> int:
        """The figure on a group of ``n_gpus``: every GPU holding layers has its own compute
        buffer and CUDA context (``gpuq/fleet/vram.py``)."""
        return on_gpus(self.vram_mib, self.per_gpu_mib, n_gpus)


class Filter(Protocol):
    @property
    def name(self) -> str: ...  # read-only: the filters are frozen dataclasses

    def reject(self, request: PlacementRequest, gpu: Candidate) -> str | None:
        """None keeps the GPU; a sentence says why it cannot take the request."""
        ...


@dataclass(frozen=True, slots=True)
class AffinityFilter:
    rules: list[Rule]
    name: str = "affinity"

    def reject(self, request: PlacementRequest, gpu: Candidate) -> str | None:
        decision = decide(self.rules, request.model, request.kind, gpu.target)
        return None if decision.allowed else f"not allowed: {decision.reason}"


@dataclass(frozen=True, slots=True)
class FitsMemoryFilter:
    """Would the model fit the GPU's whole memory: can it ever run there?"""

    name: str = "fits-memory"

    def reject(self, request: PlacementRequest, gpu: Candidate) -> str | None:
        if request.vram_mib <= gpu.target.memory_total_mib:
            return None
        return f"too small: the model needs {request.vram_mib} MiB, the GPU has {gpu.target.memory_total_mib} MiB"


@dataclass(frozen=True, slots=True)
class FitsFreeMemoryFilter:
    """Does the model fit now, beside what is loaded (or is it loaded already)?"""

    name: str = "fits-free-memory"

    def reject(self, request: PlacementRequest, gpu: Candidate) -> str | None:
        if gpu.memory_free_mib is None or request.model in gpu.loaded_models:
            return None  # unknown now: the load itself finds out
        if request.vram_mib <= gpu.memory_free_mib:
            return None
        return f"busy: the model needs {request.vram_mib} MiB, {gpu.memory_free_mib} MiB are free"


@dataclass(frozen=True, slots=True)
class HealthFilter:
    name: str = "health"

    def reject(self, request: PlacementRequest, gpu: Candidate) -> str | None:
        return None if gpu.healthy else "marked unhealthy by an admin or after repeated errors"


@dataclass(frozen=True, slots=True)
class Verdict:
    gpu: Candidate
    reasons: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.reasons


def evaluate(request: PlacementRequest, gpus: Sequence[Candidate], filters: Sequence[Filter]) -> list[Verdict]:
    """Every GPU with every reason it is dropped (empty: it may take the request)."""
    verdicts = []
    for gpu in gpus:
        reasons = [reason for f in filters if (reason := f.reject(request, gpu)) is not None]
        verdicts.append(Verdict(gpu, reasons))
    return verdicts


def can_ever_run(rules: list[Rule]) -> list[Filter]:
    """The filters for "may this job be queued at all": rules and total memory, not health
    or what is loaded now (those change; the job waits for them)."""
    return [AffinityFilter(rules), FitsMemoryFilter()]


def may_serve(rules: list[Rule]) -> list[Filter]:
    """The filters for "does this worker's GPU serve the model": rules, total memory and
    health (a GPU marked unhealthy serves nothing until an admin clears it)."""
    return [AffinityFilter(rules), FitsMemoryFilter(), HealthFilter()]


def group_for(request: PlacementRequest, gpus: Sequence[Candidate], rules: list[Rule]) -> tuple[Candidate, ...]:
    """The GPU group that runs a model too big for any single GPU: on one host, the healthy
    GPUs the rules allow, most memory first, as few as hold the model with each member's
    own compute buffer and CUDA overhead (llama.cpp splits the tensors across them). Empty
    when a single healthy GPU fits, or no host's GPUs together do. MIG devices never join."""
    allow, health = AffinityFilter(rules), HealthFilter()
    allowed = [g for g in gpus if allow.reject(request, g) is None and health.reject(request, g) is None]
    if any(g.target.memory_total_mib >= request.vram_mib for g in allowed):
        return ()
    best: tuple[Candidate, ...] = ()
    for host in sorted({g.target.host for g in allowed}):
        members: list[Candidate] = []
        whole = (g for g in allowed if g.target.host == host and not g.is_mig)
        for gpu in sorted(whole, key=lambda g: -g.target.memory_total_mib):
            members.append(gpu)
            if sum(m.target.memory_total_mib for m in members) >= request.vram_on(len(members)):
                group = tuple(sorted(members, key=lambda m: m.target.index))
                if not best or len(group) < len(best):
                    best = group
                break
    return best


def placeable(request: PlacementRequest, gpus: Sequence[Candidate], rules: list[Rule]) -> bool:
    """Whether some GPU, or GPUs of one host together, may ever run the request: what a
    submission is checked against (``gpuq.jobs.submit.check_placeable``)."""
    return any(v.ok for v in evaluate(request, gpus, can_ever_run(rules))) or bool(group_for(request, gpus, rules))


def explain_unplaceable(request: PlacementRequest, verdicts: list[Verdict]) -> str:
    parts = [f"GPU {v.gpu.target.index} on {v.gpu.target.host}: {'; '.join(v.reasons)}" for v in verdicts]
    return (
        f"no GPU, nor GPUs of one host together, may run {request.kind} jobs of model {request.model!r}: "
        + " | ".join(parts)
    )


@dataclass(frozen=True, slots=True)
class PreviewRow:
    gpu: Candidate
    allowed: bool
    fits: bool
    reasons: list[str]


def preview(request: PlacementRequest, gpus: Sequence[Candidate], rules: list[Rule]) -> list[PreviewRow]:
    """Where may this model run, and why: the rule that decides, and the memory check, per GPU
    (with what the figure counts, when the request says)."""
    basis = f" ({request.vram_basis})" if request.vram_basis else ""
    rows = []
    for gpu in gpus:
        decision = decide(rules, request.model, request.kind, gpu.target)
        too_small = FitsMemoryFilter().reject(request, gpu)
        fit = too_small or f"fits: needs {request.vram_mib} MiB of {gpu.target.memory_total_mib} MiB"
        rows.append(PreviewRow(gpu, decision.allowed, too_small is None, [decision.reason, fit + basis]))
    return rows
