"""The fleet's live workers as RQ's registry knows them, and the admin's controls that
reach them through Redis: drain and undrain (a worker or a whole host), unload a model.

State lives where it is cheapest for the worker to read and dies with what it concerns:

* a worker's drain flag is a field of its own RQ worker hash (``gpuq_drain``), so it
  disappears with the worker; a restarted worker is a new process with a new name;
* a host's drain flag is a member of one Redis set, read by every worker of that host,
  including workers started after the host was drained;
* an unload request is a member of a per-worker set with a TTL.

Each change is also announced on the worker's RQ pub/sub channel, so an idle worker acts
at once. Pub/sub is at-most-once, so workers also re-read the flags once a second; the
flags, not the messages, are the truth.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, cast

from redis import Redis
from rq.utils import utcparse
from rq.worker import Worker

from gpuq.fleet.prefix_cache_stats import PrefixCacheStats
from gpuq.redis_keys import (
    CANCEL_FLAG_TTL_S,
    DEVICE_FIELD,
    DRAIN_FIELD,
    GENERATES_FIELD,
    GPUS_FIELD,
    HOST_FIELD,
    LOADED_FIELD,
    PREFIX_CACHE_FIELD,
    RQ_WORKER_PREFIX,
    SLOT_FIELD,
    SLOTS_BUSY_FIELD,
    SLOTS_FIELD,
    drained_hosts_key,
    rq_worker_channel,
    rq_worker_key,
    unload_requests_key,
)

# Commands on a worker's RQ pub/sub channel, beside RQ's own ``stop-job``.
CONTROL_COMMAND = "gpuq-control"  # re-read your drain flags now
UNLOAD_COMMAND = "gpuq-unload"  # unload this model (at once if idle, else after the job)
REQUEUE_COMMAND = "gpuq-requeue"  # stop this job: an admin has put it back in its queue

# Sets the field only while the worker's hash exists: a hash of a worker that has just
# died must not be brought back without a TTL.
_SET_IF_ALIVE = """
if redis.call('EXISTS', KEYS[1]) == 1 and redis.call('HEXISTS', KEYS[1], 'death') == 0 then
  if ARGV[2] == '1' then redis.call('HSET', KEYS[1], ARGV[1], '1') else redis.call('HDEL', KEYS[1], ARGV[1]) end
  return 1
end
return 0
"""


WorkerState = Literal["idle", "busy", "draining", "drained"]


@dataclass(frozen=True, slots=True)
class LiveWorker:
    name: str
    host: str
    slot: str
    device: str
    gpu_uuids: tuple[str, ...]
    rq_state: str
    loaded_models: tuple[str, ...]
    last_heartbeat: datetime | None
    birth: datetime | None
    jobs_done: int
    drained_itself: bool  # its own flag
    drained_by_host: bool  # its host's flag
    slots: int = 1  # jobs it runs together at most (GPUQ_WORKER_SLOTS)
    slots_busy: int = 0  # jobs running on it now, as it last published
    prefix_cache: PrefixCacheStats | None = None  # as it last published (None: it has published none)
    # The models it serves generations of (None: not published, by a worker from before it was)
    generates: frozenset[str] | None = None

    @property
    def drain_requested(self) -> bool:
        return self.drained_itself or self.drained_by_host

    def state(self, running_jobs: Collection[str] | None = None) -> WorkerState:
        """idle, busy (any slot busy), draining (finishing its jobs, then taking no more) or drained.

        ``running_jobs`` are those SQL says run on it: SQL and the worker's hash are written
        at slightly different moments, so either one saying so makes it busy."""
        busy = bool(running_jobs) or self.slots_busy > 0 or self.rq_state == "busy"
        if self.drain_requested:
            return "draining" if busy else "drained"
        return "busy" if busy else "idle"


def _text(fields: dict[bytes, bytes], name: str) -> str:
    return fields.get(name.encode(), b"").decode()


def _time(fields: dict[bytes, bytes], name: str) -> datetime | None:
    value = _text(fields, name)
    try:
        return utcparse(value) if value else None  # timezone-aware UTC
    except ValueError:
        return None


def _split(value: str) -> tuple[str, ...]:
    return tuple(part for part in value.split(",") if part)


def _count(fields: dict[bytes, bytes], name: str, default: int) -> int:
    try:
        return int(_text(fields, name))
    except ValueError:
        return default


def _names(fields: dict[bytes, bytes], name: str) -> frozenset[str] | None:
    """A JSON list of names; None when the field is absent or not such a list."""
    try:
        value = json.loads(_text(fields, name))
    except ValueError:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    return frozenset(value)


def _slots(fields: dict[bytes, bytes]) -> tuple[int, int]:
    """(slots, slots busy). A worker from before continuous batching publishes neither: it
    runs one job at a time, busy while RQ says so (so a fleet being upgraded reads right)."""
    slots = max(1, _count(fields, SLOTS_FIELD, 1))
    busy = _count(fields, SLOTS_BUSY_FIELD, 1 if _text(fields, "state") == "busy" else 0)
    return slots, max(0, busy)


def live_workers(redis: Redis) -> list[LiveWorker]:
    """Every worker whose RQ key is alive (not expired, no death recorded), by name."""
    names = sorted(Worker.all_keys(connection=redis))
    with redis.pipeline(transaction=False) as pipe:
        for key in names:
            pipe.hgetall(key)
        pipe.smembers(drained_hosts_key())
        *hashes, hosts = pipe.execute()
    drained_hosts = {h.decode() for h in hosts}
    workers = []
    for key, fields in zip(names, hashes, strict=True):
        if not fields or b"death" in fields:
            continue
        host = _text(fields, HOST_FIELD) or _text(fields, "hostname")
        slots, slots_busy = _slots(fields)
        workers.append(
            LiveWorker(
                name=key.removeprefix(RQ_WORKER_PREFIX),
                host=host,
                slot=_text(fields, SLOT_FIELD),
                device=_text(fields, DEVICE_FIELD),
                gpu_uuids=_split(_text(fields, GPUS_FIELD)),
                rq_state=_text(fields, "state"),
                loaded_models=_split(_text(fields, LOADED_FIELD)),
                last_heartbeat=_time(fields, "last_heartbeat"),
                birth=_time(fields, "birth"),
                jobs_done=int(_text(fields, "successful_job_count") or 0) + int(_text(fields, "failed_job_count") or 0),
                drained_itself=_text(fields, DRAIN_FIELD) == "1",
                drained_by_host=host in drained_hosts,
                slots=slots,
                slots_busy=slots_busy,
                prefix_cache=PrefixCacheStats.from_json(_text(fields, PREFIX_CACHE_FIELD)),
                generates=_names(fields, GENERATES_FIELD),
            )
        )
    return workers


def record_exit(redis: Redis, *, hostname: str, slot: str, pid: int) -> list[str]:
    """A supervisor saw its worker process exit: record the death that RQ's own shutdown
    would have. A worker killed outright (SIGKILL, a CUDA abort) writes none, and would
    count as live, and busy, until its key's TTL ran out; this way it stops at once, and
    the reconciler recovers its jobs at its next pass. Returns the workers marked (none
    when the worker had already said goodbye)."""
    prefix = RQ_WORKER_PREFIX + f"{hostname}.{slot}.{pid}."  # worker names: host.slot.pid.hex
    marked = []
    for key in Worker.all_keys(connection=redis):
        if key.startswith(prefix) and (worker := Worker.find_by_key(key, connection=redis)) is not None:
            worker.register_death()
            marked.append(worker.name)
    return marked


def find_worker(redis: Redis, name: str) -> LiveWorker | None:
    return next((w for w in live_workers(redis) if w.name == name), None)


def _command(redis: Redis, workers: Iterable[str], payload: dict[str, str]) -> None:
    message = json.dumps(payload)
    with redis.pipeline(transaction=False) as pipe:
        for name in workers:
            pipe.publish(rq_worker_channel(name), message)
        pipe.execute()


def set_worker_drain(redis: Redis, name: str, *, drained: bool) -> bool:
    """Drain (or undrain) one live worker; False if no such worker is alive."""
    key = rq_worker_key(name)
    if not redis.eval(_SET_IF_ALIVE, 1, key, DRAIN_FIELD, "1" if drained else "0"):
        return False
    _command(redis, [name], {"command": CONTROL_COMMAND})
    return True


def set_host_drain(redis: Redis, host: str, workers: Iterable[str], *, drained: bool) -> bool:
    """Drain (or undrain) a host, telling its live ``workers`` at once; True if the flag changed."""
    changed = redis.sadd(drained_hosts_key(), host) if drained else redis.srem(drained_hosts_key(), host)
    _command(redis, workers, {"command": CONTROL_COMMAND})
    return bool(changed)


def drained_hosts(redis: Redis) -> set[str]:
    # Replies are bytes (no client sets decode_responses); redis-py types them bytes | str.
    return {h.decode() for h in cast(set[bytes], redis.smembers(drained_hosts_key()))}


def request_unload(redis: Redis, workers: Iterable[str], model: str) -> None:
    """Ask workers to unload ``model``: a durable request each, then the immediate command."""
    names = list(workers)
    with redis.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.sadd(unload_requests_key(name), model)
            pipe.expire(unload_requests_key(name), CANCEL_FLAG_TTL_S)
        pipe.execute()
    _command(redis, names, {"command": UNLOAD_COMMAND, "model": model})


def stop_requeued_job(redis: Redis, worker: str, job_id: str) -> None:
    """Tell the worker to stop a job an admin has put back in its queue. No durable flag
    (unlike a cancel): the job's id will run again, and a flag would stop that run too.
    If the message is lost, the old run goes on, and its outcome is discarded by the
    conditional write (the row is no longer running on that worker)."""
    _command(redis, [worker], {"command": REQUEUE_COMMAND, "job_id": job_id})


# ---------------------------------------------------------------- the worker's side


@dataclass(frozen=True, slots=True)
class Control:
    """What the admin wants of one worker now."""

    drained: bool = False
    unload: frozenset[str] = frozenset()


def read_control(redis: Redis, *, worker_key: str, worker_name: str, host: str) -> Control:
    """One round trip: the worker's own drain flag, its host's, and unload requests."""
    with redis.pipeline(transaction=False) as pipe:
        pipe.hget(worker_key, DRAIN_FIELD)
        pipe.sismember(drained_hosts_key(), host)
        pipe.smembers(unload_requests_key(worker_name))
        own, by_host, unload = pipe.execute()
    return Control(drained=own == b"1" or bool(by_host), unload=frozenset(m.decode() for m in unload))


def unload_done(redis: Redis, worker_name: str, models: Iterable[str]) -> None:
    models = list(models)
    if models:
        redis.srem(unload_requests_key(worker_name), *models)
