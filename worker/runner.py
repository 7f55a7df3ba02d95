"""Running one gpuq job: claim it in SQL, run it on llama.cpp, hand the outcome to the writer.

Everything a job can get wrong (a model file that will not load, a prompt llama.cpp
refuses) ends as a ``failed`` row with the error, never as a crashed worker. Two GPU
faults are handled apart (see ``worker/faults.py``): running out of memory while
loading (evict, retry once, then hand the job back for another GPU), and repeated CUDA
errors (the GPU is marked unhealthy).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from gpuq import store
from gpuq.db.tables import JobKind, JobStatus, utcnow
from gpuq.stats.metrics import FinishedJob
from worker.catalog import ModelInfo
from worker.energy import NOT_MEASURED, EnergyMeter
from worker.engine import JobCancelled, LoadedModel
from worker.faults import GpuHealth, HandBack, is_out_of_memory
from worker.model_cache import ModelCache, ModelSpec
from worker.outcome_writer import OutcomeWriter

log = logging.getLogger(__name__)


class JobRunner:
    def __init__(
        self,
        *,
        sessions: sessionmaker[Session],
        models: Callable[[str], ModelInfo | None],
        cache: ModelCache,
        writer: OutcomeWriter,
        worker_name: str,
        device: str,
        host: str = "",
        gpu_uuids: tuple[str, ...] = (),
        default_keep_alive_s: float = -1,
        on_gpu: bool = False,
        hand_back: Callable[[store.ClaimedJob, str], None] | None = None,
        health: GpuHealth | None = None,
        energy: EnergyMeter | None = None,
    ) -> None:
        self._sessions = sessions
        self._models = models
        self._cache = cache
        self._writer = writer
        self.worker_name = worker_name
        self.device = device
        self.host = host
        self.gpu_uuids = gpu_uuids
        self._default_keep_alive_s = default_keep_alive_s
        self._on_gpu = on_gpu
        self._hand_back = hand_back
        self._health = health
        self._energy = energy  # None on the CPU or a simulated GPU: nothing to measure

    def run(self, job_id: str, cancel: threading.Event) -> None:
        with self._sessions() as session:
            claimed = store.claim_job(
                session,
                job_id,
                worker=self.worker_name,
                device=self.device,
                host=self.host or None,
                gpu_uuid=self.gpu_uuids[0] if self.gpu_uuids else None,
            )
        if claimed is None:
            log.info("job %s is no longer queued (cancelled or taken); skipping", job_id)
            return
        model = self._models(claimed.model)

        outcome = store.Outcome(
            job_id=job_id,
            worker=self.worker_name,
            status=JobStatus.SUCCEEDED,
            finished_at=utcnow(),
            webhook_url=claimed.request.get("webhook_url"),
            owner=claimed.owner,
        )
        started = time.perf_counter()
        # Measured around the whole job, model load included; two NVML reads per job (or a
        # sampling thread on GPUs without an energy counter), nothing per token.
        energy = self._energy.start() if self._energy is not None else None
        try:
            handed_back = not self._execute(claimed, model, cancel, outcome)
        finally:
            measured = energy.stop() if energy is not None else NOT_MEASURED
        if handed_back:
            return
        if self._health is not None:
            self._health.record(outcome.error)
        outcome.finished_at = utcnow()
        outcome.run_ms = int((time.perf_counter() - started) * 1000) - (outcome.load_ms or 0)
        outcome.gpu_seconds, outcome.energy_j = measured.gpu_seconds, measured.energy_j
        self._writer.submit(outcome, _finished(claimed, outcome))

    def _execute(
        self, claimed: store.ClaimedJob, model: ModelInfo | None, cancel: threading.Event, outcome: store.Outcome
    ) -> bool:
        """Runs the job into ``outcome``; False when it was handed back to its queue instead."""
        try:
            if claimed.kind == JobKind.NOOP:
                outcome.result = {}
            elif model is None:
                raise LookupError(f"model {claimed.model!r} is no longer registered")
            else:
                self._run_model_job(claimed, model, cancel, outcome)
        except HandBack as exc:
            log.warning("handing job %s back: %s", claimed.id, exc)
            if self._hand_back is not None:
                self._hand_back(claimed, str(exc))
                return False
            outcome.status, outcome.error = JobStatus.FAILED, str(exc)
        except JobCancelled:
            outcome.status = JobStatus.CANCELLED
        except Exception as exc:  # a job's failure is recorded, never raised into the worker loop
            log.exception("job %s failed", claimed.id)
            outcome.status = JobStatus.FAILED
            outcome.error = f"{type(exc).__name__}: {exc}"
        return True

    def _run_model_job(
        self, claimed: store.ClaimedJob, model: ModelInfo, cancel: threading.Event, outcome: store.Outcome
    ) -> None:
        embedding = claimed.kind == JobKind.EMBED
        spec = ModelSpec(model.name, model.path, model.context_length, embedding, model.vram_mib)
        loaded, outcome.load_ms = self._load(spec)
        keep_alive = claimed.request.get("keep_alive")
        try:
            self._run_on(loaded, embedding, claimed, cancel, outcome)
        finally:
            self._cache.keep(spec, self._default_keep_alive_s if keep_alive is None else keep_alive)
            if keep_alive == 0:
                self._cache.unload_expired()

    def _load(self, spec: ModelSpec) -> tuple[LoadedModel, int]:
        try:
            return self._cache.get(spec)
        except Exception as exc:
            if not (self._on_gpu and is_out_of_memory(exc)):
                raise
            log.warning("out of memory loading %s; unloading everything and retrying once", spec.name)
        self._cache.clear()
        try:
            return self._cache.get(spec)
        except Exception as exc:
            if is_out_of_memory(exc):
                raise HandBack(f"{spec.name} does not fit this GPU even alone: {exc}") from exc
            raise

    def _run_on(
        self,
        loaded: LoadedModel,
        embedding: bool,
        claimed: store.ClaimedJob,
        cancel: threading.Event,
        outcome: store.Outcome,
    ) -> None:
        if embedding:
            vectors, tokens = loaded.embed(claimed.request["input"], cancel)
            outcome.result = {"embeddings": vectors, "dimensions": len(vectors[0]) if vectors else 0}
            outcome.prompt_tokens = tokens
            return
        generation = loaded.generate(claimed.request, cancel)
        outcome.result = {"text": generation.text, "finish_reason": generation.finish_reason}
        outcome.prompt_tokens = generation.prompt_tokens
        outcome.completion_tokens = generation.completion_tokens
        if generation.finish_reason == "cancelled":
            outcome.status = JobStatus.CANCELLED


def _finished(claimed: store.ClaimedJob, outcome: store.Outcome) -> FinishedJob:
    """What the metrics count for this job, once its outcome is written."""
    wait_s = (claimed.started_at - claimed.created_at).total_seconds() if claimed.created_at else None
    return FinishedJob(
        model=claimed.model,
        kind=claimed.kind,
        status=outcome.status.value,
        queue_wait_s=wait_s,
        run_s=outcome.run_ms / 1000 if outcome.run_ms is not None else None,
        completion_tokens=outcome.completion_tokens,
    )
