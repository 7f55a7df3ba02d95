"""The order a worker listens in, and the function its RQ jobs name.

Work waits in RQ queues, one per tenant of each band ``gpuq:<model>:<kind>:<priority>``
(``gpuq.queue_names``). A worker takes from the bands of the models and kinds its GPU may
run (affinity rules can name a kind), highest priority first: the first band in this order
with a job gives it, and within the band the tenants share by weight (``gpuq.jobs.fair``).
Every Redis key, these queues' included, is named in ``gpuq.redis_keys``.
"""

from __future__ import annotations

import hashlib

from gpuq.queue_names import Priority, band_name

JOB_FUNC = "worker.tasks.run_job"  # named, not imported: the API never imports the worker


def worker_queue_names(
    servable: list[tuple[str, str]],
    *,
    loaded: frozenset[str] = frozenset(),
    loaded_elsewhere: frozenset[str] = frozenset(),
    worker: str = "",
) -> list[str]:
    """The order a worker takes bands in: the HIGH band of every (model, kind) it serves, then
    every NORMAL band, then every LOW one (band names: ``gpuq.queue_names.band_name``). Within
    a priority:

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
    return [band_name(model, kind, p) for p in Priority for model, kind in ordered]
