"""How many samples (``n``) one generation may ask for: as many as one worker decodes at once.

A job's samples share its prompt and decode side by side on one worker, one KV slot each
(worker/decoding): a worker with fewer slots than ``n`` cannot run it, and its engine would
fail it after the claim. So the API refuses such a job at submit (gpuq/jobs/submit.py)
against the most slots of any live worker that serves the model's generations; each worker
publishes its slots and those models on its RQ hash (gpuq/fleet/workers.py). A worker from
before it published the models counts as serving every model: it may.

Where no live worker serves the model (the fleet is starting, or the model's workers are
down or drained away), the limit is the configured ``GPUQ_WORKER_SLOTS``, or its default
where it is 0: 8 where the fleet has GPUs, 4 where it has none. Those are the slots the
workers that start will have; accepting more would only queue a job to fail when one claims
it, hours later perhaps. The cost is a refusal while the fleet is down, of a job that a
worker configured with more slots than the API's setting could have run: the API and the
workers are meant to share their settings (docker-compose.yml gives them one environment).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuq.fleet.workers import LiveWorker
from gpuq.settings import slots_for


@dataclass(frozen=True, slots=True)
class SampleLimit:
    """The most samples a job of each model may ask for, as the fleet stands now."""

    workers: Sequence[LiveWorker]  # live (gpuq.fleet.workers.live_workers)
    configured: int  # the slots a worker that starts will have, at most

    @classmethod
    def of(cls, workers: Sequence[LiveWorker], *, worker_slots: int, has_gpus: bool) -> SampleLimit:
        """``worker_slots`` is ``GPUQ_WORKER_SLOTS``; with 0, the largest worker the fleet
        would start has the default of a GPU's where it has GPUs, else of the CPU's."""
        return cls(workers, slots_for(worker_slots, on_gpu=has_gpus))

    def most(self, model: str) -> tuple[int, bool]:
        """(the most samples a job of ``model`` may ask for, whether a live worker says so:
        False when none serves the model and the configured slots are the limit)."""
        serving = [w.slots for w in self.workers if w.generates is None or model in w.generates]
        return (max(serving), True) if serving else (self.configured, False)
