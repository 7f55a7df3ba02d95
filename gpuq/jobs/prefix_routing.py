"""Prefix-aware placement: a job goes to the worker whose cache holds its prompt's start.

At admission the API has a generation prompt's token ids (``gpuq.jobs.prompt``). It hashes
them in blocks chained from the start (``gpuq.prefix_blocks``), salted exactly as the worker's
prefix cache salts them (the model file's fingerprint and the tenant's cache scope), so a chain
the API computes is the chain a worker publishes. Each worker keeps a Redis set of the block
hashes its KV slots and RAM tier hold (``gpuq.redis_keys.prefix_index_key``, worker/prefix_index.py).

Placement, per job, among the live workers that serve its model's generations and are not
drained (the same read ``GET /v1/workers`` makes):

1. the worker whose index (or promises, below) holds the longest start of the job's chain,
   at least ``min_blocks`` blocks, gets the job in its own *lane* (``gpuq.queue_names``: a
   further queue per tenant of the job's band) **while the load guard holds**: that worker's
   load (jobs in its lanes plus its busy slots) exceeds the least loaded worker's by at most
   its slot count (SGLang's cache-aware router and vLLM's production-stack apply the same
   rule: affinity only while the load gap is small);
2. otherwise, a job with a start of at least ``min_blocks`` blocks goes to the least loaded
   worker's lane, and that worker is *promised* the start (``prefix_promised_key``, a short
   TTL): the next jobs of the family follow the first before the worker has computed it, so a
   bulk submission of interleaved families spreads families over the workers instead of
   scattering every family over all of them (SGLang routes a first request by load and inserts
   it into the tree at once, for the same reason);
3. a job with a shorter start (or none counted) waits in the shared queues, as before.

The pick (``gpuq.jobs.fair``) keeps priority first and fair shares between tenants before
affinity: a lane is only another queue of its tenant, which its worker prefers within that
tenant's turn; another worker takes a lane's first job once it has waited ``steal_s``. The
reconciler hands a lane back to the shared queues when its worker dies, drains or stops serving
its model (:func:`hand_back`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

from jinja2 import TemplateError
from redis import Redis
from redis.client import Pipeline

from gpuq.fleet.workers import LiveWorker, live_workers
from gpuq.jobs.fair import INSERT_AT
from gpuq.jobs.generation_params import GenerationParams
from gpuq.jobs.prompt import request_tokens, vocab_tokenizer
from gpuq.prefix_blocks import BLOCK_TOKENS, block_hashes, cache_scope, model_fingerprint, namespace_salt
from gpuq.queue_names import QueueEntry, is_valid_lane, parse_queue
from gpuq.redis_keys import (
    FAIR_BELL_MAX,
    FAIR_EDF_PREFIX,
    JOB_DEADLINE_FIELD,
    LANES_KEY,
    METRICS_PLACEMENT,
    RQ_JOB_PREFIX,
    RQ_QUEUE_PREFIX,
    RQ_QUEUES,
    fair_bell_key,
    fair_flows_key,
    lane_queues_key,
    prefix_index_key,
    prefix_promised_key,
    rq_queue_key,
)
from gpuq.settings import Settings

log = logging.getLogger(__name__)

MAX_BLOCKS = 64  # a chain's first blocks kept on a job (1,024 tokens): starts are told apart long before
PROMISE_TTL_S = 120.0  # a promised start no job of the family followed is forgotten
METRICS_SEP = "\t"  # as gpuq.stats.metrics separates labels


@dataclass(frozen=True, slots=True)
class PrefixRouting:
    """The API's routing settings (``GPUQ_PREFIX_ROUTING``, ``..._MIN_BLOCKS``) and the cache
    scope rule the workers key their caches by (``GPUQ_WORKER_PREFIX_CACHE_SHARED_TENANTS``)."""

    on: bool = False
    min_blocks: int = 4
    shared_tenants: bool = False


OFF = PrefixRouting()


def routing_of(settings: Settings) -> PrefixRouting:
    return PrefixRouting(
        on=settings.prefix_routing == "on",
        min_blocks=settings.prefix_routing_min_blocks,
        shared_tenants=settings.worker_prefix_cache_shared_tenants,
    )


def prefix_chain(model_path: str, owner: str | None, ids: Sequence[int], *, shared_tenants: bool) -> tuple[bytes, ...]:
    """The first ``MAX_BLOCKS`` block hashes of a prompt's tokens, salted as the worker's cache
    keys them (``worker/prefix_cache/key.py``: the model file's fingerprint, the tenant's scope)."""
    salt = namespace_salt(model_fingerprint(model_path), cache_scope(owner, shared=shared_tenants))
    return tuple(block_hashes(ids[: MAX_BLOCKS * BLOCK_TOKENS], salt))


def request_chain(
    model_path: str, owner: str | None, params: GenerationParams, routing: PrefixRouting
) -> tuple[bytes, ...] | None:
    """A request's chain where the API has not tokenised it (a batch line): its prompt rendered
    and tokenised as the worker will (``gpuq.jobs.prompt``, the model's vocabulary only); None
    when the model file cannot be read here."""
    try:
        tokenizer = vocab_tokenizer(model_path)
        ids = request_tokens(params, tokenizer.tokenize, tokenizer.formatter)
    except (OSError, ValueError, TemplateError) as exc:  # the worker reports such a line's fault
        log.warning("no prefix chain for a line of %s: %s", model_path, exc)
        return None
    return prefix_chain(model_path, owner, ids, shared_tenants=routing.shared_tenants)


@dataclass(slots=True)
class _Worker:
    name: str
    slots: int
    load: int  # jobs in its lanes, plus its busy slots


@dataclass(frozen=True, slots=True)
class Placed:
    entries: list[QueueEntry]
    affinity: int = 0  # placed on a worker holding (or promised) their start
    by_load: int = 0  # placed on the least loaded worker, their start promised to it
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)  # by model: (affinity, by load)


def place(
    redis: Redis, entries: Sequence[QueueEntry], chains: Sequence[tuple[bytes, ...] | None], routing: PrefixRouting
) -> Placed:
    """The entries with their lanes chosen (an entry keeps the shared queues where nothing
    places it), the promises made and the counts recorded, ready for ``enqueue_jobs``."""
    if not routing.on or not any(c is not None and len(c) >= routing.min_blocks for c in chains):
        return Placed(list(entries))
    by_model: dict[str, list[_Worker]] = {}
    live = [lw for lw in live_workers(redis) if not lw.drain_requested and lw.generates and is_valid_lane(lw.name)]
    loads = _loads(redis, live)
    for live_worker in live:
        for model in live_worker.generates or ():
            by_model.setdefault(model, []).append(
                _Worker(live_worker.name, max(1, live_worker.slots), loads[live_worker.name])
            )
    wanted = [
        (i, by_model[e.model])
        for i, (e, c) in enumerate(zip(entries, chains, strict=True))
        if c is not None and len(c) >= routing.min_blocks and by_model.get(e.model)
    ]
    held = _held(redis, [(cast(tuple[bytes, ...], chains[i]), [w.name for w in workers]) for i, workers in wanted])
    out = list(entries)
    counts: dict[str, list[int]] = {}
    promises: dict[str, set[bytes]] = {}
    affinity = by_load = 0
    for (i, workers), matches in zip(wanted, held, strict=True):
        chain = cast(tuple[bytes, ...], chains[i])
        start = set(chain[: routing.min_blocks])
        for w in workers:  # a start promised in this very call counts as held: the family's next jobs follow it
            if start <= promises.get(w.name, set()):
                matches[w.name] = max(matches[w.name], routing.min_blocks)
        least = min(workers, key=lambda w: (w.load, w.name))
        best = max(workers, key=lambda w: (matches[w.name], -w.load, w.name))
        if matches[best.name] >= routing.min_blocks and best.load - least.load <= best.slots:
            chosen, how = best, 0
            affinity += 1
        else:
            chosen, how = least, 1
            by_load += 1
        promises.setdefault(chosen.name, set()).update(start)
        chosen.load += 1
        out[i] = entries[i]._replace(lane=chosen.name)
        counts.setdefault(entries[i].model, [0, 0])[how] += 1
    if promises:
        with redis.pipeline(transaction=False) as pipe:
            for worker, hashes in promises.items():
                pipe.sadd(prefix_promised_key(worker), *hashes)
                pipe.expire(prefix_promised_key(worker), int(PROMISE_TTL_S))
            _count(pipe, counts)
            pipe.execute()
    return Placed(out, affinity, by_load, {m: (a, b) for m, (a, b) in counts.items()})


def _loads(redis: Redis, workers: Sequence[LiveWorker]) -> dict[str, int]:
    """Each worker's load: the jobs waiting in its lanes (every band) and its busy slots."""
    with redis.pipeline(transaction=False) as pipe:
        for w in workers:
            pipe.smembers(lane_queues_key(w.name))
        lanes = cast(list[set[bytes]], pipe.execute())
    with redis.pipeline(transaction=False) as pipe:
        for queues in lanes:
            for q in queues:
                pipe.llen(rq_queue_key(q.decode()))
        depths = iter(cast(list[int], pipe.execute()))
    return {w.name: w.slots_busy + sum(next(depths) for _ in queues) for w, queues in zip(workers, lanes, strict=True)}


def _held(redis: Redis, wanted: Sequence[tuple[tuple[bytes, ...], Sequence[str]]]) -> list[dict[str, int]]:
    """For each chain, how many of its first blocks each worker holds or was promised."""
    with redis.pipeline(transaction=False) as pipe:
        for chain, workers in wanted:
            for w in workers:
                pipe.smismember(prefix_index_key(w), list(chain))
                pipe.smismember(prefix_promised_key(w), list(chain))
        replies = iter(cast(list[list[int]], pipe.execute()))
    out = []
    for _chain, workers in wanted:
        found = {}
        for w in workers:
            index, promised = next(replies), next(replies)
            n = 0
            for a, b in zip(index, promised, strict=True):
                if not (a or b):
                    break
                n += 1
            found[w] = n
        out.append(found)
    return out


def holders(
    redis: Redis, chains: Sequence[tuple[bytes, ...] | None], workers: Sequence[str], min_blocks: int
) -> list[str | None]:
    """For each chain, the worker of ``workers`` that holds (or was promised) the longest start
    of it, at least ``min_blocks`` blocks; None where none does (a planned batch's groups,
    ``gpuq.batches.lane_split``, weigh it against their own load guard)."""
    wanted = [(c, workers) for c in chains if c is not None and len(c) >= min_blocks]
    found = iter(_held(redis, wanted) if wanted and workers else [])
    out: list[str | None] = []
    for c in chains:
        if c is None or len(c) < min_blocks or not workers:
            out.append(None)
            continue
        matches = next(found)
        best = max(workers, key=lambda w: (matches[w], w))
        out.append(best if matches[best] >= min_blocks else None)
    return out


def _count(pipe: Pipeline, counts: dict[str, list[int]]) -> None:
    for model, (affinity, by_load) in counts.items():
        if affinity:
            pipe.hincrby(METRICS_PLACEMENT, f"{model}{METRICS_SEP}affinity", affinity)
        if by_load:
            pipe.hincrby(METRICS_PLACEMENT, f"{model}{METRICS_SEP}load", by_load)


def hand_back_lanes(redis: Redis) -> int:
    """The reconciler's round: every lane whose worker is dead (its index dropped too), drained,
    or no longer serving generations of a model its lane holds goes back to the shared queues.
    Returns the jobs moved."""
    lanes = {raw.decode() for raw in cast(set[bytes], redis.smembers(LANES_KEY))}
    if not lanes:
        return 0
    live = {w.name: w for w in live_workers(redis)}
    moved = 0
    for lane in sorted(lanes):
        worker = live.get(lane)
        if worker is None:
            moved += hand_back(redis, lane)
            redis.delete(prefix_index_key(lane))
        elif worker.drain_requested:
            moved += hand_back(redis, lane)
        elif worker.generates is not None:
            moved += hand_back(redis, lane, serving=worker.generates)
    return moved


def count_stolen(redis: Redis | Pipeline, model: str) -> None:
    """A job taken from another worker's lane (its first job waited past the steal bound)."""
    redis.hincrby(METRICS_PLACEMENT, f"{model}{METRICS_SEP}stolen", 1)


# KEYS: the lane's queue, its shared queue, the band's flows and bell, RQ's queue set. ARGV:
# RQ's queue prefix, the deadline sets' prefix, RQ's job prefix, the shared queue's name, its
# tenant segment, the job hash's deadline field, the bell's length. Every job of the lane's
# queue, in its order, into the shared queue: a job with a deadline at its place among the
# deadline jobs, the others behind every job there (they were queued later than those, or as
# good as: their turn in the lane is lost, their place in the fair shares is not).
_HAND_BACK = (
    INSERT_AT
    + """
local lane, shared = KEYS[1], KEYS[2]
local prefix, edf_prefix, job_prefix, shared_name = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local lane_edf = edf_prefix .. string.sub(lane, #prefix + 1)
local shared_edf = edf_prefix .. shared_name
local moved = 0
while true do
  local id = redis.call('LPOP', lane)
  if not id then break end
  local deadline = redis.call('HGET', job_prefix .. id, ARGV[6])
  if deadline then
    redis.call('ZREM', lane_edf, id)
    insert_at(shared, redis.call('ZCOUNT', shared_edf, '-inf', deadline), id)
    redis.call('ZADD', shared_edf, deadline, id)
  else
    redis.call('RPUSH', shared, id)
  end
  redis.call('HSET', job_prefix .. id, 'origin', shared_name)
  moved = moved + 1
end
redis.call('DEL', lane_edf)
if moved > 0 then
  redis.call('SADD', KEYS[5], shared)
  redis.call('SADD', KEYS[3], ARGV[5])
  for i = 1, math.min(moved, tonumber(ARGV[7])) do redis.call('RPUSH', KEYS[4], 1) end
  redis.call('LTRIM', KEYS[4], 0, tonumber(ARGV[7]) - 1)
end
return moved
"""
)


def hand_back(redis: Redis, lane: str, *, serving: frozenset[str] | None = None) -> int:
    """The jobs waiting in a worker's lane back to the shared queues, each queue in its order
    (with ``serving``, the models the worker still serves, only those of the others); its
    promises forgotten. Safe beside workers taking from the lane meanwhile (each queue moves in
    one script). Returns the jobs moved."""
    script = redis.register_script(_HAND_BACK)
    moved = 0
    for raw in cast(set[bytes], redis.smembers(lane_queues_key(lane))):
        name = raw.decode()
        parsed = parse_queue(name)
        if serving is not None and parsed.model in serving:
            continue
        keys = [
            rq_queue_key(name),
            rq_queue_key(parsed.shared),
            fair_flows_key(parsed.band),
            fair_bell_key(parsed.band),
            RQ_QUEUES,
        ]
        args: list[str | int] = [
            RQ_QUEUE_PREFIX,
            FAIR_EDF_PREFIX,
            RQ_JOB_PREFIX,
            parsed.shared,
            parsed.tenant,
            JOB_DEADLINE_FIELD,
            FAIR_BELL_MAX,
        ]
        moved += int(cast(int, script(keys=keys, args=args)))
        with redis.pipeline(transaction=True) as pipe:
            pipe.srem(lane_queues_key(lane), name)
            pipe.srem(RQ_QUEUES, rq_queue_key(name))
            pipe.execute()
    if serving is None:
        with redis.pipeline(transaction=False) as pipe:
            pipe.delete(prefix_promised_key(lane))
            pipe.srem(LANES_KEY, lane)
            pipe.execute()
    return moved
