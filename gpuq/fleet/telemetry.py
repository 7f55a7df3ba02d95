"""Live GPU readings in Redis: published by supervisors, read by the API.

Short-lived on purpose: a reading older than ``TELEMETRY_TTL_S`` disappears, so a GPU
whose supervisor stopped shows as not live instead of showing stale numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis import Redis
from redis.typing import EncodableT, FieldT

from gpuq.db.tables import utcnow
from gpuq.fleet.gpus import GpuInfo
from gpuq.redis_keys import gpu_telemetry_key

TELEMETRY_TTL_S = 30
_FIELDS = ("memory_free_mib", "utilisation_pct", "temperature_c", "power_w")


def publish(
    redis: Redis, gpus: Sequence[GpuInfo], *, loaded: dict[str, list[str]] | None = None, absent: Sequence[str] = ()
) -> None:
    """Readings of ``gpus``; GPUs ``absent`` from this reading (NVML lost them) stop being live at once."""
    with redis.pipeline(transaction=False) as pipe:
        for uuid in absent:
            pipe.delete(gpu_telemetry_key(uuid))
        for gpu in gpus:
            key = gpu_telemetry_key(gpu.uuid)
            values: dict[FieldT, EncodableT] = {f: getattr(gpu, f) for f in _FIELDS if getattr(gpu, f) is not None}
            values["updated_at"] = utcnow().isoformat()
            values["loaded_models"] = ",".join((loaded or {}).get(gpu.uuid, []))
            pipe.delete(key)
            pipe.hset(key, mapping=values)
            pipe.expire(key, TELEMETRY_TTL_S)
        pipe.execute()


def read(redis: Redis, uuids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Live readings by GPU UUID; GPUs with none are absent."""
    with redis.pipeline(transaction=False) as pipe:
        for uuid in uuids:
            pipe.hgetall(gpu_telemetry_key(uuid))
        raw = pipe.execute()
    readings = {}
    for uuid, values in zip(uuids, raw, strict=True):
        if not values:
            continue
        decoded = {k.decode(): v.decode() for k, v in values.items()}
        readings[uuid] = {
            "memory_free_mib": _number(decoded.get("memory_free_mib"), int),
            "utilisation_pct": _number(decoded.get("utilisation_pct"), int),
            "temperature_c": _number(decoded.get("temperature_c"), int),
            "power_w": _number(decoded.get("power_w"), float),
            "loaded_models": [m for m in decoded.get("loaded_models", "").split(",") if m],
        }
    return readings


def _number(value: str | None, kind: type) -> Any:
    return kind(float(value)) if value not in (None, "") else None
