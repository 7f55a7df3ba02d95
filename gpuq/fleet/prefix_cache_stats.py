"""A worker's prefix cache figures, as it publishes them and as the API reads them.

The worker keeps them (``worker/prefix_cache/cache.py``) and writes them, as JSON, into its
RQ worker hash at every heartbeat (``gpuq.redis_keys.PREFIX_CACHE_FIELD``); ``/metrics``,
``GET /v1/workers`` and the dashboard's worker cards read them from there.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Literal

Tier = Literal["ram", "disk"]
TIERS: tuple[Tier, ...] = ("ram", "disk")


@dataclass(frozen=True, slots=True)
class TierStats:
    """One tier's figures."""

    bytes: int
    limit_bytes: int
    entries: int
    evictions: int
    hits: int
    tokens_restored: int


@dataclass(frozen=True, slots=True)
class PrefixCacheStats:
    ram_bytes: int
    ram_limit_bytes: int
    ram_entries: int
    ram_evictions: int
    disk_enabled: bool
    disk_bytes: int
    disk_limit_bytes: int
    disk_entries: int
    disk_evictions: int
    disk_damaged: int  # files found corrupt, truncated or of another format, deleted
    disk_writes_dropped: int  # saves the writer could not keep up with
    hits_ram: int
    hits_disk: int
    misses: int  # admissions neither tier could serve beyond what a KV slot held
    tokens_restored_ram: int
    tokens_restored_disk: int
    restore_failures: int  # bytes llama.cpp refused (counted as misses by the caller)
    saves: int

    def as_dict(self) -> dict[str, int | bool]:
        return asdict(self)

    def tier(self, tier: Tier) -> TierStats:
        if tier == "ram":
            return TierStats(
                self.ram_bytes,
                self.ram_limit_bytes,
                self.ram_entries,
                self.ram_evictions,
                self.hits_ram,
                self.tokens_restored_ram,
            )
        return TierStats(
            self.disk_bytes,
            self.disk_limit_bytes,
            self.disk_entries,
            self.disk_evictions,
            self.hits_disk,
            self.tokens_restored_disk,
        )

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> PrefixCacheStats | None:
        """None for anything else than what ``to_json`` wrote (an older worker wrote nothing)."""
        try:
            values = json.loads(text)
            return cls(**{f.name: values[f.name] for f in fields(cls)})
        except (ValueError, TypeError, KeyError):
            return None
