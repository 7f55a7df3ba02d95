"""Every Redis name gpuq reads or writes, in one module: a reader finds them all here.

Two families share one Redis database:

* **RQ's keys**, named through RQ's own class attributes, so RQ's workers and tools
  (``rq info``) read what gpuq writes as their own. gpuq chooses only the queue names,
  ``gpuq:<model>:<kind>:<priority>[:<tenant>]`` (checked and parsed in ``gpuq.queue_names``),
  and adds its fields to RQ's worker hashes.
* **gpuq's own keys**, all under ``gpuq:``. Each says what it holds and how long it lives.

Other modules import these names and builders; none spells a key itself.
"""

from __future__ import annotations

from rq.command import PUBSUB_CHANNEL_TEMPLATE
from rq.executions import WORKER_EXECUTIONS_KEY_TEMPLATE
from rq.intermediate_queue import IntermediateQueue
from rq.job import Job as RQJob
from rq.queue import Queue
from rq.registry import StartedJobRegistry
from rq.worker import Worker

PREFIX = "gpuq"

# ---------------------------------------------------------------- RQ's keys

RQ_QUEUES = Queue.redis_queues_keys  # a set of the keys of every queue RQ knows
RQ_QUEUE_PREFIX = Queue.redis_queue_namespace_prefix  # + queue name: the list of job ids waiting in it
RQ_JOB_PREFIX = RQJob.redis_job_namespace_prefix  # + job id: RQ's job hash (gpuq's job id is RQ's)
RQ_WORKER_PREFIX = Worker.redis_worker_namespace_prefix  # + worker name: RQ's worker hash, with a TTL


def queue_name(model: str, kind: str, priority: str) -> str:
    """An RQ queue's name from parts ``gpuq.jobs.queues.queue_name`` has checked."""
    return f"{PREFIX}:{model}:{kind}:{priority}"


def fair_flows_key(band: str) -> str:
    """The tenants with jobs waiting in a band (a set of tenant segments, "" for no tenant):
    the queues its fair pick looks at. Whatever pushes to a tenant's queue adds it; the pick
    removes a tenant whose queue it finds empty (``gpuq.jobs.fair``)."""
    return f"{PREFIX}:fair:flows:{band}"


def fair_passes_key(band: str) -> str:
    """A band's virtual times (a hash): each tenant's pass (the virtual time of its next job)
    and, under ``FAIR_VTIME_FIELD``, the band's (that of the last job taken)."""
    return f"{PREFIX}:fair:passes:{band}"


FAIR_VTIME_FIELD = "@"  # outside every tenant segment's alphabet


def fair_bell_key(band: str) -> str:
    """A list an idle worker blocks on (``BLPOP``) instead of its band's many queues: a push
    to any of the band's queues adds a token (at most ``FAIR_BELL_MAX`` wait), a worker that
    finds all its bands empty deletes their tokens, stale by then."""
    return f"{PREFIX}:fair:bell:{band}"


FAIR_BELL_MAX = 256  # tokens kept: idle workers one enqueue wakes at once

FAIR_EDF_PREFIX = f"{PREFIX}:fair:edf:"  # + queue name: a zset, below


def fair_edf_key(queue: str) -> str:
    """The jobs with a deadline in one tenant's queue, by deadline: a sorted set of job ids
    scored by the deadline (ms since the epoch). The queue's list holds every job in the order
    the pick gives them out, its deadline jobs first; this set says where a new one goes
    among them (``gpuq.jobs.enqueue``, ``gpuq.jobs.fair``)."""
    return FAIR_EDF_PREFIX + queue


def fair_lane_flows_key(band: str) -> str:
    """The lanes with jobs waiting in a band (a set of ``<tenant segment>@<lane>``): the
    worker-owned queues its fair pick looks at beside the shared ones (``gpuq.jobs.fair``,
    ``gpuq.jobs.placement``). Kept apart from the flows so that a pick finding a tenant's shared
    queue empty never drops a tenant whose jobs wait only in a lane."""
    return f"{PREFIX}:fair:lane-flows:{band}"


LANE_QUEUES_PREFIX = f"{PREFIX}:lanes:"  # + lane: a set, below


def lane_queues_key(lane: str) -> str:
    """The queues of one worker's lane (a set of queue names, any band): its depth, for the
    load guard, and what is handed back when the worker dies, drains or stops serving."""
    return LANE_QUEUES_PREFIX + lane


LANES_KEY = f"{PREFIX}:lanes"  # the lanes that have had jobs (a set): the reconciler's round
JOB_LANED_AT_FIELD = "gpuq_laned_at"  # in RQ's job hash: when it went into a lane (ms): stealing's clock


def prefix_index_key(worker: str) -> str:
    """The block hashes (``gpuq.prefix_blocks``) a worker's slots and RAM tier hold now: a set
    of 16-byte hashes it keeps in step as it gains and loses them, with its worker TTL, so a
    dead worker's index expires with it."""
    return f"{PREFIX}:prefix-index:{worker}"


def prefix_promised_key(worker: str) -> str:
    """Starts placed on a worker that it does not hold yet (a set of block hashes, with a short
    TTL): the next jobs of a family follow its first before the worker has computed it."""
    return f"{PREFIX}:prefix-promised:{worker}"


JOB_DEADLINE_FIELD = "gpuq_deadline"  # in RQ's job hash: the job's deadline (ms since the epoch), if it has one
FAIR_WEIGHTS_KEY = f"{PREFIX}:fair:weights"  # tenant segment -> weight (1 when absent); rebuilt from SQL


def rq_queue_key(name: str) -> str:
    return RQ_QUEUE_PREFIX + name


def rq_job_key(job_id: str) -> str:
    return RQ_JOB_PREFIX + job_id


def rq_started_key(queue_name: str) -> str:
    """RQ's registry of the executions started from a queue (``<job id>:<execution id>``, each
    scored by when its worker's heartbeat lapses)."""
    return StartedJobRegistry.key_template.format(queue_name)


def rq_worker_key(name: str) -> str:
    return RQ_WORKER_PREFIX + name


def rq_intermediate_key(queue_key: str) -> str:
    """Where RQ moves a job id it pops from a single queue (``LMOVE``) until the worker starts it."""
    return IntermediateQueue.get_intermediate_queue_key(queue_key)


def rq_worker_channel(name: str) -> str:
    """The worker's pub/sub channel: RQ's ``stop-job`` and gpuq's control commands."""
    return PUBSUB_CHANNEL_TEMPLATE % name


# gpuq's fields on RQ's worker hash (RQ ignores fields it does not know); they die with it.
HOST_FIELD = "gpuq_host"
SLOT_FIELD = "gpuq_slot"
DEVICE_FIELD = "gpuq_device"
GPUS_FIELD = "gpuq_gpus"
LOADED_FIELD = "gpuq_loaded"
DRAIN_FIELD = "gpuq_drain"  # "1" while an admin has drained this worker
SLOTS_FIELD = "gpuq_slots"  # sequences it decodes together per generation model (GPUQ_WORKER_SLOTS)
SLOTS_BUSY_FIELD = "gpuq_slots_busy"  # jobs running on it now
GENERATES_FIELD = "gpuq_generates"  # the models it serves generations of, a JSON list (gpuq.fleet.sample_limit)
PREFIX_CACHE_FIELD = "gpuq_prefix_cache"  # its prefix cache's figures, JSON (gpuq.fleet.prefix_cache_stats)

# ---------------------------------------------------------------- gpuq's keys

# How long a cancel flag or an unload request outlives its last write: a day covers any
# job timeout, and a flag nobody reads any more expires on its own.
CANCEL_FLAG_TTL_S = 24 * 3600


def cancel_flag_key(job_id: str) -> str:
    """Set (with ``CANCEL_FLAG_TTL_S``) while a running job should stop; its worker checks it."""
    return f"{PREFIX}:cancel:{job_id}"


# Jobs that were running beside others on a worker that died: each runs next alone, so
# that a job which crashes its worker is found out and charged, not its neighbours. A
# set; the worker that claims a job removes it. It is refreshed with each addition.
RUN_ALONE_KEY = f"{PREFIX}:run-alone"
RUN_ALONE_TTL_S = 24 * 3600


# Queued jobs the reconciler found in no queue though RQ's hash says ``queued``: popped by a
# worker that has not started them yet, or by one that died or froze in between. A hash of
# job id -> when first seen so; the next pass re-enqueues those still there (a live worker
# starts a popped job within milliseconds). Rewritten whole by each pass.
LOST_SUSPECTS_KEY = f"{PREFIX}:reconciler:in-flight"
SUSPECTS_TTL_S = 3600  # of this key and ORPHAN_SUSPECTS_KEY


# Running jobs SQL puts on a live worker that runs no execution of them (a claim whose
# acknowledgement was lost): job id -> when first seen so, as LOST_SUSPECTS_KEY.
ORPHAN_SUSPECTS_KEY = f"{PREFIX}:reconciler:orphans"


def rq_worker_executions_key(worker: str) -> str:
    """RQ's set of the executions a worker runs now (``<job id>:<execution id>``)."""
    return WORKER_EXECUTIONS_KEY_TEMPLATE.format(worker)


# Outcomes a worker could not write to SQL (the database was down), kept until written, so
# a job that finished during an outage is not run again if its worker dies before the
# database is back. A hash per worker (job id -> the outcome as JSON), and a set of the
# workers that have one; the worker's writer deletes what it wrote, the reconciler applies
# a dead worker's.
OUTCOME_SPOOLS_KEY = f"{PREFIX}:outcome-spools"
OUTCOME_SPOOL_TTL_S = 7 * 24 * 3600


def outcome_spool_key(worker: str) -> str:
    return f"{PREFIX}:outcome-spool:{worker}"


# When this Redis's data began (a float timestamp): set once by the reconciler, or by a worker
# that finds its registration gone. Missing means Redis restarted empty (or is new): live
# workers have not re-registered yet, so for a worker TTL nobody is judged dead.
REDIS_EPOCH_KEY = f"{PREFIX}:redis-epoch"


# A job's token stream (gpuq/streams/): the events its worker publishes while an interactive
# call (OpenAI's or Ollama's API) follows it. Bounded by the job's own size (each event
# carries at least one token; the stream is emptied when a new attempt starts) and expiring:
# every write refreshes STREAM_TTL_S, the end event leaves it STREAM_DONE_TTL_S more.
STREAM_TTL_S = 300
STREAM_DONE_TTL_S = 60


def job_stream_key(job_id: str) -> str:
    """A Redis stream (XADD) of a job's events: start, text deltas, end."""
    return f"{PREFIX}:stream:{job_id}"


def loaded_expiry_key(worker: str) -> str:
    """When each model a worker holds will be unloaded if unused (a hash: model -> unix time,
    or "" for never), for Ollama's /api/ps; it expires ``CANCEL_FLAG_TTL_S`` after its last write
    (/api/ps reads only live workers' hashes, so a dead worker's is never shown)."""
    return f"{PREFIX}:loaded-expiry:{worker}"


def gpu_telemetry_key(uuid: str) -> str:
    """Live readings a supervisor publishes for one GPU (a hash with a short TTL)."""
    return f"{PREFIX}:gpu:{uuid}"


def too_small_key(gpu_uuid: str) -> str:
    """Models that ran out of memory loading on this GPU even alone: a sorted set, each model
    scored by the Unix time its mark ends (``gpuq/fleet/health.py``)."""
    return f"{PREFIX}:too-small-until:{gpu_uuid}"


def drained_hosts_key() -> str:
    """Hosts an admin has drained (a set): their workers, present and future, take no jobs."""
    return f"{PREFIX}:drained-hosts"


def unload_requests_key(worker: str) -> str:
    """Models an admin asked this worker to unload (a set with ``CANCEL_FLAG_TTL_S``)."""
    return f"{PREFIX}:unload:{worker}"


def rate_limit_key(api_key_id: str) -> str:
    """An API key's submission token bucket (a hash: tokens, at), expiring once full again."""
    return f"{PREFIX}:rate:{api_key_id}"


# Prometheus counters and histograms (hashes without a TTL: cumulative, as Prometheus expects).
METRICS_JOBS = f"{PREFIX}:metrics:jobs"  # model, kind, status -> count
METRICS_TOKENS = f"{PREFIX}:metrics:tokens"  # model -> completion tokens
METRICS_LOADS = f"{PREFIX}:metrics:loads"  # model -> loads
METRICS_QUEUE_WAIT = f"{PREFIX}:metrics:queue_wait"  # histogram by model, kind
METRICS_RUN = f"{PREFIX}:metrics:run"  # histogram by model, kind
METRICS_LOAD_TIME = f"{PREFIX}:metrics:load_time"  # histogram by model
METRICS_PARKING = f"{PREFIX}:metrics:parking"  # model, "parked" or "resumed" -> sequences
METRICS_PLACEMENT = f"{PREFIX}:metrics:placement"  # model, how ("affinity", "load", "stolen") -> jobs
METRICS_PROMPT_TOKENS = f"{PREFIX}:metrics:prompt-tokens"  # host, slot, "all" or "cached" -> prompt tokens
METRICS_RESTARTS = f"{PREFIX}:metrics:restarts"  # host, supervisor slot -> workers restarted
