"""Affinity rules: which GPUs a model may run on.

A rule names models (a glob, and optionally a job kind), selects GPUs (indices, UUIDs, a
name glob, a host glob, a minimum memory; all given criteria must hold) and allows or
denies. For one model, kind and GPU:

1. the rules whose model pattern and kind match are the *relevant* rules;
2. the relevant rule with the highest precedence whose selector matches the GPU decides
   (ties: the newer rule, the larger id, wins);
3. if none selects the GPU: denied when some relevant rule is an ``allow`` (an allow
   rule confines the model to its GPUs), allowed otherwise (no rules, or only denies).

So "text models on GPUs 0-1, embedding models on GPUs 2-3" is two allow rules, and
"never on the old GPU" is one deny rule. Pure functions over plain values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase

_GLOB = re.compile(r"^[A-Za-z0-9._\-*?\[\]!]+$")


@dataclass(frozen=True, slots=True)
class GpuTarget:
    """What a selector can look at."""

    uuid: str
    index: int
    name: str
    host: str
    memory_total_mib: int


@dataclass(frozen=True, slots=True)
class Rule:
    id: int
    model_pattern: str
    kind: str | None
    effect: str  # "allow" or "deny"
    precedence: int = 0
    gpu_indices: tuple[int, ...] | None = None
    gpu_uuids: tuple[str, ...] | None = None
    gpu_name_pattern: str | None = None
    host_pattern: str | None = None
    min_memory_mib: int | None = None

    def applies_to(self, model: str, kind: str) -> bool:
        return fnmatchcase(model, self.model_pattern) and (self.kind is None or self.kind == kind)

    def selects(self, gpu: GpuTarget) -> bool:
        return (
            (self.gpu_indices is None or gpu.index in self.gpu_indices)
            and (self.gpu_uuids is None or gpu.uuid in self.gpu_uuids)
            and (self.gpu_name_pattern is None or fnmatchcase(gpu.name, self.gpu_name_pattern))
            and (self.host_pattern is None or fnmatchcase(gpu.host, self.host_pattern))
            and (self.min_memory_mib is None or gpu.memory_total_mib >= self.min_memory_mib)
        )

    def describe(self) -> str:
        what = self.model_pattern + (f" ({self.kind})" if self.kind else "")
        return f"rule {self.id}: {self.effect} {what}"


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    reason: str
    rule_id: int | None = None


def decide(rules: list[Rule], model: str, kind: str, gpu: GpuTarget) -> Decision:
    relevant = sorted((r for r in rules if r.applies_to(model, kind)), key=lambda r: (r.precedence, r.id), reverse=True)
    for rule in relevant:
        if rule.selects(gpu):
            return Decision(rule.effect == "allow", f"{rule.describe()} selects this GPU", rule.id)
    if any(r.effect == "allow" for r in relevant):
        return Decision(False, "allow rules confine this model to other GPUs")
    return Decision(True, "no rule restricts this model here")


def glob_problem(pattern: str) -> str | None:
    """Why a glob is unusable, or None (fnmatch itself accepts anything)."""
    if not pattern.strip():
        return "a pattern cannot be empty"
    if pattern.count("[") != pattern.count("]"):
        return f"pattern {pattern!r} has an unclosed [ ] set"
    return None


def model_pattern_problem(pattern: str) -> str | None:
    if not _GLOB.match(pattern):
        return (
            f"model pattern {pattern!r} may use only letters, digits, '.', '_', '-' and the glob characters * ? [ ] !"
        )
    return glob_problem(pattern)
