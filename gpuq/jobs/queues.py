"""The order a worker listens in, and the function its RQ jobs name.

Work waits in RQ queues named ``gpuq:<model>:<kind>:<priority>`` (``gpuq.queue_names``). A worker listens on
the queues of the models and kinds its GPU may run (affinity rules can name a kind),
highest priority first, so RQ's ordered ``BLPOP`` gives priority order for free.
Every Redis key, these queues' included, is named in ``gpuq.redis_keys``.
"""

from __future__ import annotations

import hashlib

from gpuq.queue_names import Priority, queue_name

JOB_FUNC = "worker.tasks.run_job"  # named, not imported: the API never imports the worker


def worker_queue_names(
    servable: list[tuple[str, str]],
    *,
    loaded: frozenset[str] = frozenset(),
    loaded_elsewhere: frozenset[str] = frozenset(),
    worker: str = "",
) -> list[str]:
    """The order a worker listens in: the HIGH queue of every (model, kind) it serves, then
    every NORMAL queue, then every LOW one. Within a priority:

    1. models this worker has loaded (sticky: no load needed);
    2. models no other worker has loaded (spread: another worker already serves the rest);
    3. the others, which makes this worker a replica when their queues are deep.

    Ties are broken by rendezvous hashing of (worker, model), so idle workers that know
    nothing yet still prefer different models instead of all loading the first one."""

    def rank(pair: tuple[str, str]) -> tuple[bool, bool, str]:
        model = pair[0]
        spread = hashlib.sha1(f"{worker}/{model}".encode()).hexdigest() if worker else ""
        return (model not in loaded, model in loaded_elsewhere, spread)

    ordered = sorted(servable, key=rank)  # stable: keeps the given order when nothing differs
    return [queue_name(model, kind, p) for p in Priority for model, kind in ordered]
