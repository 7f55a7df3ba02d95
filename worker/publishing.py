"""What a worker tells the fleet on its RQ worker hash, and the RQ bookkeeping it owes Redis.

The API, ``GET /v1/workers``, ``/metrics`` and the dashboard read a worker's hash: which
GPUs it runs on, which models it holds and until when (Ollama's ``/api/ps``), which models
it generates for (the API's refusal of ``n`` above every worker's slots,
gpuq/fleet/sample_limit.py), its prefix cache's figures. Each is written only when it
changed, or with a heartbeat, so an idle fleet costs Redis little.

During an outage the bookkeeping of a job's end cannot reach Redis; it is kept here, in
order, and sent by the worker's loop once Redis answers (the outcome itself is in SQL
already: nothing waits on it).

Threads: the worker's main thread calls everything here (a run's engine, which ends jobs
through ``send_or_keep``, is that thread). The monitor thread's heartbeat publishes the
prefix cache's figures, and when Redis lost the worker's registration it registers again,
which publishes the loaded models too: both threads then compute the same list (the model
cache changes only on the main thread), so the worst a race on ``_loaded`` costs is one
write more.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from redis import Redis
from redis.client import Pipeline
from redis.exceptions import RedisError

from gpuq.db.tables import JobKind
from gpuq.fleet import workers as control
from gpuq.fleet.prefix_cache_stats import PrefixCacheStats
from gpuq.redis_keys import (
    CANCEL_FLAG_TTL_S,
    GENERATES_FIELD,
    PREFIX_CACHE_FIELD,
    SLOTS_BUSY_FIELD,
    SLOTS_FIELD,
    loaded_expiry_key,
)
from worker.outages import Dependency
from worker.runner import JobRunner

log = logging.getLogger(__name__)


class Publisher:
    def __init__(
        self,
        connection: Redis,
        *,
        key: str,
        name: str,
        runner: JobRunner,
        loaded_models: Callable[[], list[str]],
        model_expiries: Callable[[], dict[str, float | None]],
        prefix_cache_stats: Callable[[], PrefixCacheStats] | None,
        redis_health: Dependency,
    ) -> None:
        self._redis = connection
        self._key = key
        self._name = name
        self._runner = runner
        self._loaded_models = loaded_models
        self._model_expiries = model_expiries
        self._prefix_cache_stats = prefix_cache_stats
        self._redis_health = redis_health
        # What Redis holds now; None: unknown, write at the next chance.
        self._loaded: str | None = None
        self._generates: str | None = None
        self._expiries: dict[str, float | None] | None = None
        self._unsent: list[Callable[[], None]] = []  # RQ bookkeeping that Redis could not take yet

    def registered(self, *, slot: str, slots: int, servable: list[tuple[str, str]]) -> None:
        """Right after RQ's registration: what ``GET /v1/workers`` shows about a gpuq worker."""
        self._loaded = ""
        self._redis.hset(
            self._key,
            mapping={
                control.HOST_FIELD: self._runner.host,
                control.SLOT_FIELD: slot,
                control.DEVICE_FIELD: self._runner.device,
                control.GPUS_FIELD: ",".join(self._runner.gpu_uuids),
                control.LOADED_FIELD: "",
                SLOTS_FIELD: slots,
                SLOTS_BUSY_FIELD: 0,
            },
        )
        self._generates = None
        self.generates(servable)

    def loaded(self, pipe: Pipeline) -> None:
        """Which models this worker holds (for telemetry, dashboards and GET /v1/workers), if
        that changed since the last time."""
        loaded = ",".join(self._loaded_models())
        if loaded != self._loaded:
            self._loaded = loaded
            pipe.hset(
                self._key,
                mapping={control.LOADED_FIELD: loaded, control.GPUS_FIELD: ",".join(self._runner.gpu_uuids)},
            )

    def generates(self, servable: list[tuple[str, str]]) -> None:
        """The models this worker serves generations of, when they changed. Raises RedisError,
        and publishes at the next call, if Redis does not answer."""
        generates = json.dumps(sorted({m for m, kind in servable if kind == JobKind.GENERATE.value}))
        if generates != self._generates:
            self._redis.hset(self._key, GENERATES_FIELD, generates)
            self._generates = generates

    def models(self) -> None:
        """Between jobs: the models loaded (a keep_alive may have unloaded one since the last
        job's end) and when each will be unloaded if unused, written only when they changed."""
        expiries = self._model_expiries()
        if expiries == self._expiries:
            return
        key = loaded_expiry_key(self._name)
        try:
            with self._redis.pipeline(transaction=False) as pipe:
                self.loaded(pipe)
                pipe.delete(key)
                if expiries:
                    pipe.hset(key, mapping={m: "" if at is None else f"{at:.3f}" for m, at in expiries.items()})
                    pipe.expire(key, CANCEL_FLAG_TTL_S)
                pipe.execute()
        except RedisError:
            log.warning("could not publish model expiry times", exc_info=True)
            return
        self._expiries = expiries

    def prefix_cache(self, pipe: Pipeline) -> None:
        """Its prefix cache's figures, for /metrics and the dashboard, with each heartbeat."""
        if self._prefix_cache_stats is not None:
            pipe.hset(self._key, PREFIX_CACHE_FIELD, self._prefix_cache_stats().to_json())

    def send_or_keep(self, send: Callable[[], None], what: str) -> None:
        """RQ bookkeeping that must reach Redis some time: sent now, or kept and sent by
        ``send_unsent`` once Redis answers."""
        try:
            send()
        except RedisError as exc:
            self._redis_health.failed(f"recording {what}", exc)
            self._loaded = None  # publish again with the kept bookkeeping
            self._unsent.append(send)

    def send_unsent(self) -> None:
        """What ``send_or_keep`` kept, in order. Raises RedisError, keeping the rest, if Redis
        still does not answer."""
        while self._unsent:
            self._unsent[0]()  # RedisError: it stays first in line
            self._unsent.pop(0)
