"""Prometheus metrics: counters and histograms kept in Redis, rendered by the API at scrape.

Why Redis and not ``prometheus_client``'s in-process registry: the API may run as several
processes (and restarts), while the events happen in workers. An in-process counter
would reset with every API restart and differ between API replicas, and the workers run
no HTTP server to scrape. So the process where an event happens adds it to Redis hashes
(``HINCRBY``/``HINCRBYFLOAT``, one pipeline): workers at job end, inside the outcome
writer's group commit, and at each model load; the API's cancel and the reconciler for
the final states they decide; supervisors at each restart of a worker. Any API process
renders the same cumulative figures. If Redis is emptied the counters start again from
zero, which Prometheus reads as a counter reset (``rate()`` handles it); SQL keeps the
history (the worker events table too).

Gauges (queue depth and the age of each queue's oldest job, GPU telemetry, workers, their
slots) are read at scrape time from Redis (and SQL: when a queue's front job was submitted,
each GPU's health), so they are current and need no writer. ``gpuq_redis_up`` says whether
that read worked: with Redis down, a scrape still answers, with what SQL alone knows (GPU
health) and ``gpuq_redis_up 0``, so an alert can name the cause. The database has no such
gauge: the scrape's key is checked in SQL, so with the database down the scrape fails and
Prometheus's own ``up`` is 0.

Label cardinality stays bounded: models, kinds, statuses, priorities, GPUs, hosts, worker
states and supervisor slots. Never job ids, and no worker names (they carry a pid and
change on every restart): workers are counted per host and state, and their slots summed
per host and supervisor slot (``gpu0``, ``group0+1``, ``cpu``: fixed by the host's GPUs),
with the slot's GPU UUIDs as ``gpu``, so they join the GPU gauges.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry
from redis import Redis
from redis.client import Pipeline

from gpuq.db.tables import Gpu, utcnow
from gpuq.fleet import telemetry
from gpuq.fleet.prefix_cache_stats import TIERS, PrefixCacheStats
from gpuq.fleet.workers import live_workers
from gpuq.queue_names import Priority, band_name
from gpuq.redis_keys import (
    METRICS_JOBS,
    METRICS_LOAD_TIME,
    METRICS_LOADS,
    METRICS_PARKING,
    METRICS_PLACEMENT,
    METRICS_PROMPT_TOKENS,
    METRICS_QUEUE_WAIT,
    METRICS_RESTARTS,
    METRICS_RUN,
    METRICS_TOKENS,
    fair_flows_key,
    fair_lane_flows_key,
    rq_queue_key,
)
from gpuq.stats.backlog import Backlog

log = logging.getLogger(__name__)

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # text exposition format 0.0.4, what every Prometheus reads
MIB = 1 << 20
_SEP = "\t"  # model names, kinds and statuses never contain a tab (see queues.is_valid_model_name)

# Seconds. Queue waits run from milliseconds (idle fleet) to hours (a big low-priority batch);
# runs from a noop to a long generation; loads from a cached small model to a 70B on a slow disk.
QUEUE_WAIT_BUCKETS_S = (0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 4 * 3600)
RUN_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
LOAD_BUCKETS_S = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 180)


# ---------------------------------------------------------------- recording (workers, API, reconciler)


@dataclass(frozen=True, slots=True)
class FinishedJob:
    """What the metrics need from a job that reached a final state."""

    model: str
    kind: str
    status: str
    queue_wait_s: float | None = None
    run_s: float | None = None
    completion_tokens: int | None = None
    parks: int = 0  # times its sequences were parked for more urgent jobs
    resumes: int = 0  # ... and resumed
    host: str = ""  # where it ran (a worker's host label and supervisor slot), for its prompt tokens
    slot: str = ""
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # of its prompt tokens, those a KV slot or the prefix cache gave


class _Increments:
    """Increments summed per Redis field before they are sent, so a group commit of 500 noop
    jobs costs a handful of commands, not thousands."""

    def __init__(self) -> None:
        self.ints: dict[tuple[str, str], int] = defaultdict(int)
        self.floats: dict[tuple[str, str], float] = defaultdict(float)

    def __bool__(self) -> bool:
        return bool(self.ints or self.floats)

    def observe(self, key: str, labels: tuple[str, ...], buckets: Sequence[float], value: float) -> None:
        """One histogram observation: the count of the first bucket that holds it (the API
        makes them cumulative when rendering), the sum and the count. Buckets are stored by
        their bound, not an index, so changing the bounds later cannot mislabel old counts."""
        prefix = _SEP.join(labels) + _SEP
        bound = next((b for b in buckets if value <= b), math.inf)
        self.ints[(key, f"{prefix}le={float(bound)}")] += 1
        self.floats[(key, f"{prefix}sum")] += value
        self.ints[(key, f"{prefix}count")] += 1

    def add_finished(self, jobs: Iterable[FinishedJob]) -> None:
        for job in jobs:
            self.ints[(METRICS_JOBS, _SEP.join((job.model, job.kind, job.status)))] += 1
            if job.completion_tokens:
                self.ints[(METRICS_TOKENS, job.model)] += job.completion_tokens
            if job.queue_wait_s is not None:
                self.observe(
                    METRICS_QUEUE_WAIT, (job.model, job.kind), QUEUE_WAIT_BUCKETS_S, max(0.0, job.queue_wait_s)
                )
            if job.run_s is not None:
                self.observe(METRICS_RUN, (job.model, job.kind), RUN_BUCKETS_S, max(0.0, job.run_s))
            if job.parks:
                self.ints[(METRICS_PARKING, _SEP.join((job.model, "parked")))] += job.parks
            if job.resumes:
                self.ints[(METRICS_PARKING, _SEP.join((job.model, "resumed")))] += job.resumes
            if job.prompt_tokens and job.host:
                where = _SEP.join((job.host, job.slot))
                self.ints[(METRICS_PROMPT_TOKENS, f"{where}{_SEP}all")] += job.prompt_tokens
                if job.cached_tokens:
                    self.ints[(METRICS_PROMPT_TOKENS, f"{where}{_SEP}cached")] += job.cached_tokens

    def send(self, pipe: Pipeline) -> None:
        for (key, field), n in self.ints.items():
            pipe.hincrby(key, field, n)
        for (key, field), x in self.floats.items():
            pipe.hincrbyfloat(key, field, x)


class FinishedJobCounts:
    """Finished jobs counted in memory and sent to Redis together, for a worker finishing
    hundreds of short jobs a second: one pipeline per send instead of one per group commit
    (a pipeline per commit cost that benchmark about a tenth of its jobs/s). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._unsent = _Increments()

    def add(self, jobs: Iterable[FinishedJob]) -> None:
        with self._lock:
            self._unsent.add_finished(jobs)

    def __bool__(self) -> bool:
        with self._lock:
            return bool(self._unsent)

    def send(self, redis: Redis) -> None:
        """Best effort: SQL already holds the outcomes, and a metrics outage must not stop work."""
        with self._lock:
            unsent, self._unsent = self._unsent, _Increments()
        if not unsent:
            return
        try:
            with redis.pipeline(transaction=False) as pipe:
                unsent.send(pipe)
                pipe.execute()
        except Exception:
            log.warning("could not add finished jobs to the metrics", exc_info=True)


def record_finished_jobs(redis: Redis, jobs: Iterable[FinishedJob]) -> None:
    """Count jobs that reached a final state now (API cancels, the reconciler, batch cancels)."""
    counts = FinishedJobCounts()
    counts.add(jobs)
    counts.send(redis)


def record_model_load(redis: Redis, model: str, seconds: float) -> None:
    try:
        with redis.pipeline(transaction=False) as pipe:
            inc = _Increments()
            inc.ints[(METRICS_LOADS, model)] += 1
            inc.observe(METRICS_LOAD_TIME, (model,), LOAD_BUCKETS_S, seconds)
            inc.send(pipe)
            pipe.execute()
    except Exception:
        log.warning("could not count the load of %s in the metrics", model, exc_info=True)


def record_restart(redis: Redis, *, host: str, slot: str) -> None:
    """A supervisor restarted the worker of one of its slots (after a crash or any exit)."""
    try:
        redis.hincrby(METRICS_RESTARTS, _SEP.join((host, slot)), 1)
    except Exception:
        log.warning("could not count the restart of %s/%s in the metrics", host, slot, exc_info=True)


# ---------------------------------------------------------------- rendering (API, at scrape)


QueueKey = tuple[str, str, str]  # model, kind, priority


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one scrape shows, read from Redis in one go (``redis_up``: whether it could be)."""

    counters: dict[str, dict[str, Any]]
    queue_depth: dict[QueueKey, int]
    gpus: list[tuple[Gpu, dict[str, Any]]]  # the GPUs with live telemetry, and their readings
    workers: dict[tuple[str, str], int]  # (host, state) -> live workers
    # (host, slot, GPU UUIDs) -> (slots, slots busy), summed over the slot's live workers
    # (two while a restarted worker's predecessor is still registered).
    slots: dict[tuple[str, str, str], tuple[int, int]]
    inventory: Sequence[Gpu] = ()  # every GPU some supervisor recorded (SQL)
    # The job at the front of each tenant's queue of a band (each tenant's oldest waiting).
    queue_front: dict[QueueKey, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    # (host, slot) -> each live worker's prefix cache figures there, as it last published them
    prefix_caches: dict[tuple[str, str], list[PrefixCacheStats]] = dataclasses.field(default_factory=dict)
    redis_up: bool = True

    @classmethod
    def without_redis(cls, gpus: Sequence[Gpu]) -> Snapshot:
        """What a scrape knows while Redis does not answer: the inventory and its health."""
        return cls({}, {}, [], {}, {}, inventory=gpus, redis_up=False)


def _decode(raw: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in raw.items()}


def read_snapshot(redis: Redis, *, queues: Sequence[tuple[str, str]], gpus: Sequence[Gpu]) -> Snapshot:
    """``queues``: the (model, kind) pairs to report depth for, all three priorities each (a
    band's depth summed over its tenants' queues: the flows of ``gpuq.jobs.fair``)."""
    bands = [(m, k, p.label, band_name(m, k, p)) for m, k in queues for p in Priority]
    keys = (
        METRICS_JOBS,
        METRICS_TOKENS,
        METRICS_LOADS,
        METRICS_QUEUE_WAIT,
        METRICS_RUN,
        METRICS_LOAD_TIME,
        METRICS_RESTARTS,
        METRICS_PARKING,
        METRICS_PLACEMENT,
        METRICS_PROMPT_TOKENS,
    )
    with redis.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.hgetall(key)
        for *_, band in bands:
            pipe.smembers(fair_flows_key(band))
            pipe.smembers(fair_lane_flows_key(band))  # jobs placed in workers' lanes count too
        raw = pipe.execute()
    flows = raw[len(keys) :]
    tenant_queues = (
        [
            ((m, k, p), f"{band}:{t.decode()}" if t else band)
            for (m, k, p, band), tenants in zip(bands, flows[::2], strict=True)
            for t in sorted(set(tenants) | {b""})  # the band's own queue (no tenant) always
        ]
        + [
            ((m, k, p), f"{band}:{lane.decode()}")
            for (m, k, p, band), lanes in zip(bands, flows[1::2], strict=True)
            for lane in sorted(lanes)
        ]
    )
    with redis.pipeline(transaction=False) as pipe:
        for _band, name in tenant_queues:
            pipe.llen(rq_queue_key(name))
            pipe.lindex(rq_queue_key(name), 0)  # each tenant's oldest waiting job
        lists = pipe.execute()
    depth = {(m, k, p): 0 for m, k, p, _ in bands}
    front: dict[QueueKey, tuple[str, ...]] = {}
    for (band_key, _name), n, job in zip(tenant_queues, lists[::2], lists[1::2], strict=True):
        depth[band_key] += int(n)
        if job:
            front[band_key] = (*front.get(band_key, ()), job.decode())
    counters = {key: _decode(values) for key, values in zip(keys, raw, strict=False)}
    live = telemetry.read(redis, [g.uuid for g in gpus])
    workers: dict[tuple[str, str], int] = defaultdict(int)
    slots: dict[tuple[str, str, str], tuple[int, int]] = defaultdict(lambda: (0, 0))
    caches: dict[tuple[str, str], list[PrefixCacheStats]] = defaultdict(list)
    for worker in live_workers(redis):  # one pipelined read of every worker's hash
        workers[(worker.host, worker.rq_state or "unknown")] += 1
        slot = (worker.host, worker.slot, ",".join(worker.gpu_uuids))
        total, busy = slots[slot]
        slots[slot] = (total + worker.slots, busy + worker.slots_busy)
        if worker.prefix_cache is not None:
            caches[(worker.host, worker.slot)].append(worker.prefix_cache)
    gpu_readings = [(g, live[g.uuid]) for g in gpus if g.uuid in live]
    return Snapshot(counters, depth, gpu_readings, dict(workers), dict(slots), gpus, front, dict(caches))


def _counter(name: str, doc: str, labels: list[str], values: dict[str, str]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=labels)
    for field, value in sorted(values.items()):
        family.add_metric(field.split(_SEP), float(value))
    return family


def _histogram(
    name: str, doc: str, labels: list[str], values: dict[str, str], bounds: Sequence[float]
) -> HistogramMetricFamily:
    """Every series gets every bucket (zeros included), so quantiles compare across series."""
    per_series: dict[tuple[str, ...], dict[str, Any]] = defaultdict(lambda: {"buckets": {}, "sum": 0.0})
    for field, value in values.items():
        *series, part = field.split(_SEP)
        entry = per_series[tuple(series)]
        if part.startswith("le="):
            entry["buckets"][float(part[3:])] = int(value)
        else:
            entry[part] = float(value)
    family = HistogramMetricFamily(name, doc, labels=labels)
    for labels_of_series, entry in sorted(per_series.items()):
        cumulative, buckets = 0, []
        for bound in sorted({*map(float, bounds), math.inf, *entry["buckets"]}):  # +Inf sorts last
            cumulative += entry["buckets"].get(bound, 0)
            buckets.append(("+Inf" if math.isinf(bound) else repr(bound), cumulative))
        family.add_metric(list(labels_of_series), buckets, entry["sum"])
    return family


def _gpu_families(gpus: list[tuple[Gpu, dict[str, Any]]]) -> Iterator[Metric]:
    """Only what the GPU reports: a simulated GPU has memory figures and nothing else,
    so it has no utilisation, temperature or power series at all (never a made-up 0)."""
    labels = ["gpu", "host", "name"]
    families = {
        "memory_used": GaugeMetricFamily("gpuq_gpu_memory_used_bytes", "GPU memory in use", labels=labels),
        "memory_total": GaugeMetricFamily("gpuq_gpu_memory_total_bytes", "GPU memory in all", labels=labels),
        "utilisation": GaugeMetricFamily("gpuq_gpu_utilization_ratio", "GPU busy fraction (NVML)", labels=labels),
        "temperature": GaugeMetricFamily("gpuq_gpu_temperature_celsius", "GPU temperature", labels=labels),
        "power": GaugeMetricFamily("gpuq_gpu_power_watts", "GPU power draw", labels=labels),
    }
    for gpu, live in gpus:
        values = [gpu.uuid, gpu.host, gpu.name]
        families["memory_total"].add_metric(values, gpu.memory_total_mib * MIB)
        if live.get("memory_free_mib") is not None:
            families["memory_used"].add_metric(values, max(0, gpu.memory_total_mib - live["memory_free_mib"]) * MIB)
        if live.get("utilisation_pct") is not None:
            families["utilisation"].add_metric(values, live["utilisation_pct"] / 100)
        if live.get("temperature_c") is not None:
            families["temperature"].add_metric(values, live["temperature_c"])
        if live.get("power_w") is not None:
            families["power"].add_metric(values, live["power_w"])
    yield from families.values()


def _health_families(s: Snapshot) -> Iterator[Metric]:
    """What an alert needs even when little else answers: Redis, and each GPU's health."""
    up = GaugeMetricFamily("gpuq_redis_up", "1 if this scrape could read Redis (the queues), else 0")
    up.add_metric([], 1 if s.redis_up else 0)
    yield up
    labels = ["gpu", "host", "name"]
    healthy = GaugeMetricFamily(
        "gpuq_gpu_healthy", "0 once a GPU is marked unhealthy (repeated CUDA errors), until cleared", labels=labels
    )
    for gpu in s.inventory:
        healthy.add_metric([gpu.uuid, gpu.host, gpu.name], 1 if gpu.healthy else 0)
    yield healthy
    if not s.redis_up:
        return  # whether a GPU's supervisor is publishing is read from Redis
    reporting = {gpu.uuid for gpu, _live in s.gpus}
    live = GaugeMetricFamily(
        "gpuq_gpu_live", "1 while the GPU's supervisor publishes its telemetry (every 5 s, kept 30 s)", labels=labels
    )
    for gpu in s.inventory:
        live.add_metric([gpu.uuid, gpu.host, gpu.name], 1 if gpu.uuid in reporting else 0)
    yield live


def _queue_families(s: Snapshot, created: dict[str, datetime], now: datetime) -> Iterator[Metric]:
    labels = ["model", "kind", "priority"]
    depth = GaugeMetricFamily("gpuq_queue_depth", "jobs waiting in Redis", labels=labels)
    oldest = GaugeMetricFamily(
        "gpuq_queue_oldest_job_age_seconds",
        "how long the oldest job at the front of a tenant's queue has waited since it was submitted; "
        "0 when the queue is empty",
        labels=labels,
    )
    for key, n in sorted(s.queue_depth.items()):
        depth.add_metric(list(key), n)
        times = [created[job] for job in s.queue_front.get(key, ()) if job in created]
        submitted = min(times) if times else None
        oldest.add_metric(list(key), max(0.0, (now - submitted).total_seconds()) if n and submitted else 0.0)
    yield depth
    yield oldest


def _backlog_families(backlog: dict[str, Backlog]) -> Iterator[Metric]:
    prompt = GaugeMetricFamily(
        "gpuq_queued_prompt_tokens",
        "prompt tokens of the jobs queued (SQL; a prompt not counted at submission at the model's recent mean), "
        "per model",
        labels=["model"],
    )
    completion = GaugeMetricFamily(
        "gpuq_queued_completion_tokens",
        "completion tokens the jobs queued may generate (max_tokens times n, SQL), per model",
        labels=["model"],
    )
    late = GaugeMetricFamily(
        "gpuq_queued_jobs_past_deadline", "jobs still queued after their deadline (SQL), per model", labels=["model"]
    )
    for model, b in sorted(backlog.items()):
        prompt.add_metric([model], b.prompt_tokens)
        completion.add_metric([model], b.completion_tokens)
        late.add_metric([model], b.past_deadline)
    yield prompt
    yield completion
    yield late


class _SnapshotCollector(Collector):
    def __init__(
        self, snapshot: Snapshot, created: dict[str, datetime], now: datetime, backlog: dict[str, Backlog]
    ) -> None:
        self._snapshot = snapshot
        self._created = created
        self._now = now
        self._backlog = backlog

    def collect(self) -> Iterator[Metric]:
        s = self._snapshot
        yield from _health_families(s)
        yield from _backlog_families(self._backlog)  # from SQL: known with Redis down too
        if not s.redis_up:
            return  # counters, queues, telemetry and workers all live in Redis: unknown, not zero
        yield from _queue_families(s, self._created, self._now)
        c = s.counters
        yield _counter("gpuq_jobs", "jobs that reached a final status", ["model", "kind", "status"], c[METRICS_JOBS])
        yield _histogram(
            "gpuq_job_queue_wait_seconds",
            "from submission to a worker's claim",
            ["model", "kind"],
            c[METRICS_QUEUE_WAIT],
            QUEUE_WAIT_BUCKETS_S,
        )
        yield _histogram(
            "gpuq_job_run_seconds", "running, model load excluded", ["model", "kind"], c[METRICS_RUN], RUN_BUCKETS_S
        )
        yield _counter("gpuq_tokens_generated", "completion tokens generated", ["model"], c[METRICS_TOKENS])
        yield _counter("gpuq_model_loads", "models loaded by workers", ["model"], c[METRICS_LOADS])
        yield _histogram(
            "gpuq_model_load_seconds", "time to load a model", ["model"], c[METRICS_LOAD_TIME], LOAD_BUCKETS_S
        )
        yield _counter(
            "gpuq_worker_restarts",
            "workers a supervisor restarted in one of its slots, after a crash or any other exit",
            ["host", "slot"],
            c[METRICS_RESTARTS],
        )
        yield from _parking_families(c[METRICS_PARKING])
        yield _counter(
            "gpuq_jobs_placed",
            "generation jobs the API placed in a worker's lane by their prompt's start (affinity: a worker holding it; "
            "load: the least loaded worker, promised it), and those a worker took from another's lane (stolen)",
            ["model", "how"],
            c[METRICS_PLACEMENT],
        )
        yield from _prompt_token_families(c[METRICS_PROMPT_TOKENS])
        yield from _gpu_families(s.gpus)
        workers = GaugeMetricFamily("gpuq_workers", "live workers by host and state", labels=["host", "state"])
        for (host, state), n in sorted(s.workers.items()):
            workers.add_metric([host, state], n)
        yield workers
        yield from _slot_families(s.slots)
        yield from _prefix_cache_families(s.prefix_caches)


def _parking_families(counts: dict[str, str]) -> Iterator[Metric]:
    """Preemption: sequences parked for more urgent jobs (their KV in host memory), and resumed."""
    by_event: dict[str, dict[str, str]] = {"parked": {}, "resumed": {}}
    for field, n in counts.items():
        model, event = field.rsplit(_SEP, 1)
        by_event[event][model] = n
    yield _counter(
        "gpuq_sequences_parked", "sequences that gave their slot up to a more urgent job", ["model"], by_event["parked"]
    )
    yield _counter("gpuq_sequences_resumed", "parked sequences that took a slot again", ["model"], by_event["resumed"])


def _prompt_token_families(counts: dict[str, str]) -> Iterator[Metric]:
    """Prompt tokens of the jobs each supervisor slot's workers ran, and those of them a KV slot
    or the prefix cache gave (reused, not computed)."""
    by_part: dict[str, dict[str, str]] = {"all": {}, "cached": {}}
    for field, n in counts.items():
        where, part = field.rsplit(_SEP, 1)
        by_part[part][where] = n
    yield _counter("gpuq_prompt_tokens", "prompt tokens of the jobs run", ["host", "slot"], by_part["all"])
    yield _counter(
        "gpuq_prompt_tokens_cached",
        "prompt tokens taken from a KV slot or the prefix cache instead of computed",
        ["host", "slot"],
        by_part["cached"],
    )


def _slot_families(slots: dict[tuple[str, str, str], tuple[int, int]]) -> Iterator[Metric]:
    """Jobs the workers of each supervisor slot can run together, and run now."""
    labels = ["host", "slot", "gpu"]
    total = GaugeMetricFamily("gpuq_worker_slots", "jobs live workers can run together", labels=labels)
    busy = GaugeMetricFamily("gpuq_worker_slots_busy", "jobs running on live workers now", labels=labels)
    for key, (n, running) in sorted(slots.items()):
        total.add_metric(list(key), n)
        busy.add_metric(list(key), running)
    yield total
    yield busy


def _prefix_cache_families(caches: dict[tuple[str, str], list[PrefixCacheStats]]) -> Iterator[Metric]:
    """The workers' prefix caches (host RAM and disk tiers beyond the KV slots), per
    supervisor slot; counters restart with the worker, as Prometheus expects of counters."""
    tiered = ["host", "slot", "tier"]
    size = GaugeMetricFamily("gpuq_prefix_cache_bytes", "prompt starts kept by the prefix cache", labels=tiered)
    limit = GaugeMetricFamily("gpuq_prefix_cache_limit_bytes", "the prefix cache's bound", labels=tiered)
    entries = GaugeMetricFamily("gpuq_prefix_cache_entries", "prompt starts kept", labels=tiered)
    hits = CounterMetricFamily("gpuq_prefix_cache_hits", "prompts whose start a tier restored", labels=tiered)
    restored = CounterMetricFamily(
        "gpuq_prefix_cache_restored_tokens", "prompt tokens restored instead of computed", labels=tiered
    )
    evictions = CounterMetricFamily("gpuq_prefix_cache_evictions", "starts dropped for room", labels=tiered)
    misses = CounterMetricFamily(
        "gpuq_prefix_cache_misses", "prompts neither tier could serve beyond a KV slot", labels=["host", "slot"]
    )
    saves = CounterMetricFamily(
        "gpuq_prefix_cache_saves", "starts saved as their slot was reclaimed", labels=["host", "slot"]
    )
    for (host, slot), stats in sorted(caches.items()):
        for tier in TIERS:
            labels = [host, slot, tier]
            figures = [c.tier(tier) for c in stats]
            size.add_metric(labels, sum(f.bytes for f in figures))
            limit.add_metric(labels, sum(f.limit_bytes for f in figures))
            entries.add_metric(labels, sum(f.entries for f in figures))
            hits.add_metric(labels, sum(f.hits for f in figures))
            restored.add_metric(labels, sum(f.tokens_restored for f in figures))
            evictions.add_metric(labels, sum(f.evictions for f in figures))
        misses.add_metric([host, slot], sum(c.misses for c in stats))
        saves.add_metric([host, slot], sum(c.saves for c in stats))
    yield from (size, limit, entries, hits, restored, evictions, misses, saves)


def render(
    snapshot: Snapshot,
    *,
    created: dict[str, datetime] | None = None,
    now: datetime | None = None,
    backlog: dict[str, Backlog] | None = None,
) -> bytes:
    """The text exposition of one snapshot (a fresh registry each time: nothing is kept in the
    API). ``created``: when the queues' front jobs (``snapshot.queue_front``) were submitted;
    ``backlog``: the queued jobs' tokens per model (``gpuq.stats.backlog``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SnapshotCollector(snapshot, created or {}, now or utcnow(), backlog or {}))
    return generate_latest(registry)
