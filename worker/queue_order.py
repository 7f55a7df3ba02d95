"""Which bands a worker takes jobs from, in what order, and the fair pick over them.

What a worker serves (models and kinds, from the registry and the affinity rules) is
re-read every few seconds, so a new model or a changed rule is served without a restart;
what other workers hold is re-read with it; the order (``worker_queue_names``: priority
first, then the models this worker has loaded, then those nobody has) is recomputed after
every job, because the worker's own loaded set changes with its jobs. Within the order,
``gpuq.jobs.fair.Picker`` shares each band between tenants.

Only the worker's main thread refreshes the order; a run's desk reads the picker it left.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from redis import Redis
from redis.exceptions import RedisError
from rq.worker import Worker
from sqlalchemy.exc import SQLAlchemyError

from gpuq.jobs import fair
from gpuq.jobs.prefix_routing import hand_back
from gpuq.jobs.queues import worker_queue_names
from gpuq.redis_keys import LOADED_FIELD
from worker.outages import Dependency

log = logging.getLogger(__name__)


class QueueOrder:
    def __init__(
        self,
        connection: Redis,
        *,
        worker_name: str,
        list_servable: Callable[[], list[tuple[str, str]]],
        loaded_models: Callable[[], list[str]],
        refresh_interval_s: float,
        sql: Dependency,
        steal_s: float = fair.STEAL_S,
    ) -> None:
        self._redis = connection
        self._worker_name = worker_name
        self._steal_s = steal_s
        self._worker_key = Worker.redis_worker_namespace_prefix + worker_name
        self._list_servable = list_servable
        self._loaded_models = loaded_models
        self.refresh_interval_s = refresh_interval_s
        self._sql = sql
        self.servable = list_servable()
        self._loaded_elsewhere: frozenset[str] = frozenset()
        self._refreshed_at = time.monotonic()
        self._key: tuple[list[tuple[str, str]], frozenset[str], frozenset[str]] | None = None
        self.names = worker_queue_names(self.servable)
        self._picker: fair.Picker | None = None
        self._lane_handed_back = False  # while drained or serving nothing: its lane went back

    def refresh(self) -> bool:
        """Re-read what this worker serves and what others hold, at most once per interval,
        and order the bands again; True when the order changed (``names``)."""
        if time.monotonic() - self._refreshed_at >= self.refresh_interval_s:
            self._refreshed_at = time.monotonic()
            try:
                servable = self._list_servable()
            except SQLAlchemyError as exc:  # keep serving what it served; retried next interval
                self._sql.failed("reading the models it serves", exc)
                servable = self.servable
            # A read that answers does not end the claims' backoff: on a full disk SQLite reads
            # and cannot write, and clearing it here had the worker retry a failing claim at
            # every wake-up. Only a claim that goes through ends it (``JobRunner.claim``).
            if servable != self.servable:
                log.info("serving %s", ", ".join(f"{m} ({k})" for m, k in servable) or "nothing")
                self.servable = servable
            self._loaded_elsewhere = self._models_loaded_by_others()
        key = (self.servable, frozenset(self._loaded_models()), self._loaded_elsewhere)
        if key == self._key:
            return False
        self._key = key
        self.names = worker_queue_names(key[0], loaded=key[1], loaded_elsewhere=key[2], worker=self._worker_name)
        return True

    def hand_back_lane(self, redis_health: Dependency) -> None:
        """Jobs placed in this worker's lane go back to the shared queues, once while it is
        drained or serves nothing (the reconciler does it too, and for a worker that died)."""
        if self._lane_handed_back:
            return
        try:
            moved = hand_back(self._redis, self._worker_name)
        except RedisError as exc:
            redis_health.failed("handing its lane back", exc)
            return
        self._lane_handed_back = True
        if moved:
            log.info("%d jobs of its lane back to the shared queues", moved)

    def lane_in_use(self) -> None:
        """Taking jobs again: its lane is its own until the next drain."""
        self._lane_handed_back = False

    def picker(self) -> fair.Picker:
        """The fair pick over the ordered bands and this worker's lane (its name:
        ``gpuq.jobs.prefix_routing``), rebuilt when the order changes."""
        if self._picker is None or self._picker.bands != self.names:
            self._picker = fair.Picker(self._redis, self.names, lane=self._worker_name, steal_s=self._steal_s)
        return self._picker

    def _models_loaded_by_others(self) -> frozenset[str]:
        keys = [k for k in Worker.all_keys(connection=self._redis) if k != self._worker_key]
        with self._redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hget(key, LOADED_FIELD)
            values = pipe.execute()
        return frozenset(m for v in values if v for m in v.decode().split(",") if m)
