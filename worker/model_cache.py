"""Models a worker keeps loaded between jobs, least recently used evicted first.

Keyed by (model name, mode): llama.cpp needs a separate context for embeddings, and on a
GPU each instance holds its own weights, so each counts against the budget. Bounded by a
count and, on a GPU, by the worker's share of the GPU's memory: a model is loaded only if
its VRAM figure fits beside what is resident, else the least recently used models are
unloaded first. On a real GPU it must also fit what NVML says is free now (``fits_now``:
other processes and sibling workers hold memory too); when it does not even with this
worker's own models unloaded, :class:`GpuBusy` says so and nothing is loaded.

Each use also sets how long the model may then sit idle (``keep_alive``, as in Ollama: a
job's own value, or the worker's default; negative keeps it until evicted, 0 unloads it
right after the job). The worker calls :meth:`ModelCache.unload_expired` while idle.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from worker.engine import LoadedModel

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    path: str
    n_ctx: int
    embedding: bool
    vram_mib: int = 0
    per_gpu_mib: int | None = None  # what each GPU of a group sets aside (tensor_split)

    @property
    def key(self) -> tuple[str, bool]:
        return (self.name, self.embedding)


Loader = Callable[[ModelSpec], LoadedModel]
OnLoad = Callable[[ModelSpec, float], object]  # (what was loaded, seconds it took)
FitsNow = Callable[[ModelSpec], str | None]  # None: it fits the GPU's free memory now; else why not


class GpuBusy(MemoryError):
    """Not enough free GPU memory for the model now, even with this worker's models unloaded
    (the message says "out of memory", as llama.cpp's own failure would)."""


class ModelCache:
    def __init__(
        self,
        loader: Loader,
        *,
        max_loaded: int,
        budget_mib: int | None = None,
        on_load: OnLoad | None = None,
        fits_now: FitsNow | None = None,
    ) -> None:
        self._loader = loader
        self._on_load = on_load  # the worker counts loads and their time in the metrics
        self._max_loaded = max_loaded
        self._budget_mib = budget_mib
        self._fits_now = fits_now
        self._loaded: OrderedDict[tuple[str, bool], tuple[ModelSpec, LoadedModel]] = OrderedDict()
        self._expires_at: dict[tuple[str, bool], float | None] = {}

    def get(self, spec: ModelSpec) -> tuple[LoadedModel, int]:
        """The loaded model and how long loading it took now (0 when it was already resident)."""
        entry = self._loaded.get(spec.key)
        if entry is not None and entry[0] == spec:
            self._loaded.move_to_end(spec.key)
            return entry[1], 0
        if entry is not None:  # re-registered with another file or context: reload
            self._unload(spec.key)
        while self._loaded and not self._room_for(spec):
            self._unload(next(iter(self._loaded)))
        self._make_room_now(spec)
        started = time.perf_counter()
        model = self._loader(spec)
        load_s = time.perf_counter() - started
        load_ms = int(load_s * 1000)
        if self._on_load is not None:
            self._on_load(spec, load_s)
        self._loaded[spec.key] = (spec, model)
        log.info("loaded %s (%s) in %d ms", spec.name, "embed" if spec.embedding else "generate", load_ms)
        return model, max(load_ms, 1)

    def keep(self, spec: ModelSpec, keep_alive_s: float, *, shortens: bool = True, now: float | None = None) -> None:
        """After a job: the model may stay loaded ``keep_alive_s`` more seconds (forever if < 0).
        Unless ``shortens`` (an admin's job), it keeps the later of that and its current expiry."""
        if spec.key in self._loaded:
            now = time.monotonic() if now is None else now
            wanted = None if keep_alive_s < 0 else now + keep_alive_s
            current = self._expires_at.get(spec.key, now)
            if not shortens and (current is None or (wanted is not None and current > wanted)):
                return
            self._expires_at[spec.key] = wanted

    def unload_expired(self, *, now: float | None = None) -> list[str]:
        now = time.monotonic() if now is None else now
        expired = [k for k, at in self._expires_at.items() if at is not None and at <= now and k in self._loaded]
        for key in expired:
            self._unload(key)
        return [name for name, _ in expired]

    def _make_room_now(self, spec: ModelSpec) -> None:
        """Unload least recently used models until the GPU's free memory holds ``spec``."""
        if self._fits_now is None:
            return
        while (busy := self._fits_now(spec)) is not None:
            if not self._loaded:
                raise GpuBusy(f"out of memory before loading {spec.name}: {busy}")
            self._unload(next(iter(self._loaded)))

    def _room_for(self, spec: ModelSpec) -> bool:
        if len(self._loaded) >= self._max_loaded:
            return False
        return self._budget_mib is None or self.used_mib() + spec.vram_mib <= self._budget_mib

    def used_mib(self) -> int:
        return sum(spec.vram_mib for spec, _ in self._loaded.values())

    def loaded_models(self) -> list[LoadedModel]:
        """The models loaded now (a copy: read by the heartbeat's thread)."""
        return [model for _spec, model in list(self._loaded.values())]

    def loaded_names(self) -> list[str]:
        return sorted({name for name, _ in self._loaded})

    def expiries(self) -> dict[str, float | None]:
        """Per loaded model, the Unix time at which it is unloaded if unused; None while it is
        kept forever, or has not finished its first job yet (either instance, when loaded twice)."""
        offset = time.time() - time.monotonic()
        out: dict[str, float | None] = {}
        for key in self._loaded:
            at = self._expires_at.get(key)
            wall = None if at is None else at + offset
            earlier = out.get(key[0], 0.0)
            out[key[0]] = None if wall is None or (key[0] in out and earlier is None) else max(wall, earlier or 0.0)
        return out

    def unload(self, name: str) -> bool:
        """Unload every instance (generate, embed) of ``name`` now, as an admin asked; True if any was loaded."""
        keys = [key for key in self._loaded if key[0] == name]
        for key in keys:
            self._unload(key)
        return bool(keys)

    def clear(self) -> None:
        for key in list(self._loaded):
            self._unload(key)

    def _unload(self, key: tuple[str, bool]) -> None:
        self._expires_at.pop(key, None)
        _spec, model = self._loaded.pop(key)
        model.close()
        log.info("unloaded %s", key[0])
