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
from dataclasses import dataclass

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from gpuq import store
from gpuq.db.tables import JobKind, JobStatus, utcnow
from gpuq.jobs.generation_params import GenerationParams
from gpuq.jobs.request import EmbeddingParams, JobParams
from gpuq.stats.metrics import FinishedJob
from gpuq.streams.events import End, Start, end_of_job, wants_end, wants_tokens
from gpuq.streams.publish import StreamPublisher
from worker.catalog import ModelInfo
from worker.decoding import BatchDecoder, Finished, Generation, Piece
from worker.energy import NOT_MEASURED, EnergyMeter, JobEnergy, Measurement
from worker.engine import JobCancelled, LoadedModel, Prepared, embed_key
from worker.faults import GpuHealth, HandBack, is_out_of_memory
from worker.generation_result import delta_of, result_of
from worker.model_cache import ModelCache, ModelSpec
from worker.outages import Dependency
from worker.outcome_writer import OutcomeWriter

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Running:
    """A claimed job's bookkeeping from its start to its outcome."""

    claimed: store.ClaimedJob
    params: JobParams  # its request, read back typed once (as its kind's params)
    outcome: store.Outcome
    started: float  # time.perf_counter()
    energy: JobEnergy | None
    spec: ModelSpec | None = None
    keep_alive: float | None = None
    # Its part of what the GPU did while it ran, by tokens, when other jobs shared the GPU
    # with it (continuous batching, grouped embeddings): energy and GPU time are scaled by it.
    share: float = 1.0
    tokens_at_start: int = 0  # the decoder's token count when it joined
    decoder: BatchDecoder | None = None
    generation: Generation | None = None
    parks: int = 0  # its sequences parked for more urgent jobs, and resumed (for /metrics)
    resumes: int = 0
    _measured: Measurement | None = None

    def decoded(self) -> int:
        """Every token its decoder has decoded so far, its own and its neighbours'."""
        return self.decoder.tokens_decoded if self.decoder is not None else 0

    def energy_stop(self) -> Measurement:
        if self._measured is None:
            self._measured = self.energy.stop() if self.energy is not None else NOT_MEASURED
        return self._measured


class _AllSet:
    """Reads as set once every one of several jobs' cancel events is."""

    def __init__(self, events: list[threading.Event]) -> None:
        self._events = events

    def is_set(self) -> bool:
        return all(event.is_set() for event in self._events)


def _scaled(value: float | None, share: float) -> float | None:
    return None if value is None else value * share


def _spec(model: ModelInfo, *, embedding: bool) -> ModelSpec:
    return ModelSpec(model.name, model.path, model.context_length, embedding, model.vram_mib, model.per_gpu_mib)


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
        send_back: Callable[[store.ClaimedJob, str], None] | None = None,
        health: GpuHealth | None = None,
        energy: EnergyMeter | None = None,
        streams: StreamPublisher | None = None,
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
        self._hand_back = hand_back  # out of memory loading: another GPU should take it
        self._send_back = send_back  # no KV room beside the others: back in front, uncharged
        self._health = health
        self._energy = energy  # None on the CPU or a simulated GPU: nothing to measure
        self._streams = streams  # token streams of interactive calls (None: nothing published)
        # job id -> its bookkeeping and model, while its sequence runs
        self._generating: dict[str, _Running] = {}
        # models used since keep_models, with keep_alive and whether it may shorten their stay
        self._kept: list[tuple[ModelSpec, float | None, bool]] = []
        self._unconfirmed: set[str] = set()  # claims that raised: their COMMIT may still have gone through
        self.sql = Dependency("the database", meanwhile="taking no new job until it answers")

    def claim(self, job_id: str) -> store.ClaimedJob | None:
        """Queued to running in SQL for this worker; None (and logged) if it is no longer queued.

        A claim that raises (the database went away mid-claim) is remembered: if the job comes
        back to this worker and is found running here, that earlier claim did commit and the
        job is adopted, with the attempt it already counted."""
        try:
            with self._sessions() as session:
                claimed = store.claim_job(
                    session,
                    job_id,
                    worker=self.worker_name,
                    device=self.device,
                    host=self.host or None,
                    gpu_uuid=self.gpu_uuids[0] if self.gpu_uuids else None,
                )
                if claimed is None and job_id in self._unconfirmed:
                    claimed = store.claimed_by(session, job_id, worker=self.worker_name)
                    if claimed is not None:
                        log.warning("job %s was claimed here before its acknowledgement was lost; running it", job_id)
        except SQLAlchemyError as exc:
            self._unconfirmed.add(job_id)
            self.sql.failed(f"claiming {job_id}", exc)
            raise
        self.sql.succeeded()
        self._unconfirmed.discard(job_id)
        if claimed is None:
            log.info("job %s is no longer queued (cancelled or taken); skipping", job_id)
        return claimed

    def run_noop(self, job_id: str) -> None:
        """A job that runs no model (``noop``: the dispatch path alone), claim to outcome.
        Generations and embeddings never come here: they run through batching.py's runs."""
        claimed = self.claim(job_id)
        if claimed is None:
            return
        assert claimed.kind == JobKind.NOOP, f"a {claimed.kind} job in the no-op path"
        running = self._start(claimed, JobParams.from_stored(claimed.request))
        running.outcome.result = {}
        self._settle(running)

    # ------------------------------------------------------------- generations decoded together

    def prepare_generation(
        self, claimed: store.ClaimedJob, cancel: threading.Event, deadline: float | None
    ) -> Prepared | None:
        """Loads the job's model (if need be), tokenises its prompt (unless the API did) and starts its stream: a
        request ready for the decoder. None when the job ended at once (failed, handed back);
        its outcome is then already on its way."""
        params = GenerationParams.from_stored(claimed.request)
        running = self._start(claimed, params)
        model = self._models(claimed.model)
        try:
            if model is None:
                raise LookupError(f"model {claimed.model!r} is no longer registered")
            spec = _spec(model, embedding=False)
            loaded, running.outcome.load_ms = self._load(spec)
            running.spec, running.keep_alive = spec, params.keep_alive
            prepared = loaded.prepare(
                claimed.id,
                params,
                cancel,
                deadline,
                claimed.prompt_ids,
                owner=claimed.owner,
                priority=claimed.priority,
            )
            running.outcome.prompt_tokens, running.decoder = len(prepared.tokens), prepared.decoder
        except HandBack as exc:
            self._hand_back_or_settle(running, exc)
            return None
        except Exception as exc:
            log.exception("job %s failed", claimed.id)
            running.outcome.status, running.outcome.error = JobStatus.FAILED, f"{type(exc).__name__}: {exc}"
            self._settle(running)
            return None
        self._generating[claimed.id] = running
        return prepared

    def admitted(self, job_id: str, cached_tokens: int, tokens_decoded: int) -> None:
        """The decoder took the job's request: its stream starts (the first event of an attempt)."""
        running = self._generating[job_id]
        running.tokens_at_start = tokens_decoded
        running.outcome.cached_tokens = cached_tokens
        claimed, params = running.claimed, running.params
        if self._streams is not None and wants_tokens(params.events):
            assert isinstance(params, GenerationParams)
            start = Start(claimed.attempts, running.outcome.prompt_tokens, running.outcome.load_ms)
            self._streams.start(claimed.id, start, max_tokens=params.max_new_tokens * params.n)

    def refuse(self, job_id: str, why: str) -> None:
        """The decoder could not take the job's request (its prompt does not fit, say): it fails."""
        running = self._generating.pop(job_id)
        running.outcome.status, running.outcome.error = JobStatus.FAILED, why
        self._settle(running)

    def publish_pieces(self, pieces: list[Piece], *, ended: bool) -> None:
        """Streaming sequences' text of one decoder step (``ended``: some sequence ended in it,
        so everything held is sent now, before any end)."""
        if self._streams is not None and (pieces or ended):
            deltas = [(piece.key, delta_of(piece, self._token_bytes(piece.key))) for piece in pieces]
            self._streams.deltas(deltas, now=ended)

    def _token_bytes(self, job_id: str) -> Callable[[int], bytes]:
        running = self._generating.get(job_id)
        if running is None or running.decoder is None:
            return lambda token: b""
        return running.decoder.token_bytes

    def finish_generation(self, finished: Finished) -> None:
        """A request left the decoder: record its outcome, or send its job back to its queue."""
        running = self._generating.pop(finished.key)
        outcome = running.outcome
        if finished.evicted:
            # Not the GPU's fault nor the job's: no mark, no attempt charged, back in front.
            running.energy_stop()
            if self._send_back is not None:
                self._send_back(running.claimed, "no KV cache room beside the other sequences")
            else:
                outcome.status, outcome.error = JobStatus.FAILED, "no KV cache room beside the other sequences"
                self._settle(running)
            if self._streams is not None:
                self._streams.forget(running.claimed.id)
            return
        if not finished.generations:
            outcome.status, outcome.error = JobStatus.FAILED, finished.error
        else:
            assert running.decoder is not None
            self._record_generation(finished.generations, outcome, running.decoder)
            running.parks = sum(g.parks for g in finished.generations)
            running.resumes = sum(g.resumes for g in finished.generations)
            running.generation = finished.generations[0]
            # Only what this job had llama.cpp compute: prompt tokens taken from a KV stream
            # cost nothing, and were paid for by the job that computed them.
            own = (outcome.prompt_tokens or 0) - (outcome.cached_tokens or 0)
            own += sum(g.completion_tokens for g in finished.generations)
            decoded = running.decoded() - running.tokens_at_start  # its own and its neighbours'
            running.share = min(1.0, own / decoded) if decoded > 0 else 1.0
        self._settle(running)

    def unload(self, model: str) -> None:
        self._cache.unload(model)

    def keep_models(self) -> None:
        """After a run of generations: their models' keep_alive starts now (a keep_alive of 0
        unloads only here, never while a sequence of the model is live)."""
        kept, self._kept = self._kept, []
        unload_now = False
        for spec, keep_alive, shortens in kept:
            self._cache.keep(spec, self._default_keep_alive_s if keep_alive is None else keep_alive, shortens=shortens)
            unload_now |= keep_alive == 0 and shortens
        if unload_now:
            self._cache.unload_expired()

    # ------------------------------------------------------------- embeddings of several jobs together

    def run_embeddings(self, jobs: list[tuple[store.ClaimedJob, threading.Event]]) -> None:
        """Embedding jobs of one model, their inputs embedded together in llama.cpp calls; each
        job still gets its own vectors, token count and outcome, and the measured energy is
        shared by tokens. A job cancelled meanwhile ends ``cancelled``; the call stops early
        only when all are."""
        requests = [EmbeddingParams.from_stored(claimed.request) for claimed, _cancel in jobs]
        runs = [self._start(claimed, params) for (claimed, _cancel), params in zip(jobs, requests, strict=True)]
        model = self._models(jobs[0][0].model)
        try:
            if model is None:
                raise LookupError(f"model {jobs[0][0].model!r} is no longer registered")
            spec = _spec(model, embedding=True)
            loaded, runs[0].outcome.load_ms = self._load(spec)
            inputs = [item for params in requests for item in params.input]
            by_key = loaded.embed_inputs(inputs, _AllSet([cancel for _claimed, cancel in jobs]))
        except HandBack as exc:
            for running in runs:
                self._hand_back_or_settle(running, exc)
            return
        except JobCancelled:
            for running in runs:
                running.outcome.status = JobStatus.CANCELLED
                self._settle(running)
            return
        except Exception as exc:  # a job's failure is recorded, never raised into the worker loop
            log.exception("embedding jobs %s failed", ", ".join(c.id for c, _ in jobs))
            for running in runs:
                running.outcome.status, running.outcome.error = JobStatus.FAILED, f"{type(exc).__name__}: {exc}"
                self._settle(running)
            return
        keys = [[embed_key(item) for item in params.input] for params in requests]
        tokens = [sum(by_key[key][1] for key in set(own_keys)) for own_keys in keys]
        for (_claimed, cancel), running, own, own_keys in zip(jobs, runs, tokens, keys, strict=True):
            running.spec, running.keep_alive = spec, running.params.keep_alive
            running.share = own / sum(tokens) if sum(tokens) else 1.0 / len(jobs)
            self._record_embeddings([by_key[key][0] for key in own_keys], own, running.outcome)
            if cancel.is_set():
                running.outcome.status, running.outcome.result = JobStatus.CANCELLED, None
            self._settle(running)
        self.keep_models()

    @staticmethod
    def _record_embeddings(vectors: list[list[float]], tokens: int, outcome: store.Outcome) -> None:
        outcome.result = {"embeddings": vectors, "dimensions": len(vectors[0]) if vectors else 0}
        outcome.prompt_tokens = tokens

    # ------------------------------------------------------------- one job's bookkeeping

    def _start(self, claimed: store.ClaimedJob, params: JobParams) -> _Running:
        outcome = store.Outcome(
            job_id=claimed.id,
            worker=self.worker_name,
            status=JobStatus.SUCCEEDED,
            finished_at=utcnow(),
            webhook_url=params.webhook_url,
            owner=claimed.owner,
            run_id=claimed.run_id,  # written only while the row is still in this run
        )
        # Measured around the whole job, model load included; two NVML reads per job (or a
        # sampling thread on GPUs without an energy counter), nothing per token.
        energy = self._energy.start() if self._energy is not None else None
        return _Running(claimed, params, outcome, time.perf_counter(), energy)

    def _settle(self, running: _Running) -> None:
        outcome = running.outcome
        # The run's clock stops before the energy meter, so the measured span (started
        # first, stopped last) always covers the run and load it is reported beside.
        outcome.finished_at = utcnow()
        outcome.run_ms = int((time.perf_counter() - running.started) * 1000) - (outcome.load_ms or 0)
        measured = running.energy_stop()
        if running.spec is not None:
            shortens = bool(running.params.keep_alive_shortens)  # an admin's (gpuq/jobs/submit.py)
            self._kept.append((running.spec, running.keep_alive, shortens))
        if self._health is not None:
            self._health.record(outcome.error)
        outcome.gpu_seconds, outcome.energy_j = (
            _scaled(measured.gpu_seconds, running.share),
            _scaled(measured.energy_j, running.share),
        )
        if measured.energy_j is not None or measured.gpu_seconds is not None:
            outcome.energy_share = round(running.share, 4)
        end = _end(outcome, running.generation) if wants_end(running.params.events) else None
        slot = parts[1] if len(parts := self.worker_name.rsplit(".", 3)) == 4 else ""  # as worker.slot_of reads it
        self._writer.submit(outcome, _finished(running, outcome, host=self.host or "", slot=slot), end)

    def _hand_back_or_settle(self, running: _Running, exc: HandBack) -> None:
        self._hand_back_or_fail(running.claimed, running.outcome, exc)
        if running.outcome.status == JobStatus.FAILED:
            self._settle(running)
        else:
            running.energy_stop()
            if self._streams is not None:
                self._streams.forget(running.claimed.id)  # its next attempt starts its stream afresh

    def _hand_back_or_fail(self, claimed: store.ClaimedJob, outcome: store.Outcome, exc: HandBack) -> None:
        log.warning("handing job %s back: %s", claimed.id, exc)
        if self._hand_back is not None:
            self._hand_back(claimed, str(exc))
        else:
            outcome.status, outcome.error = JobStatus.FAILED, str(exc)

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

    @staticmethod
    def _record_generation(generations: tuple[Generation, ...], outcome: store.Outcome, decoder: BatchDecoder) -> None:
        """Usage counts the prompt once and every sample's completion."""
        first = generations[0]
        outcome.result = result_of(generations, decoder.token_bytes)
        outcome.prompt_tokens = first.prompt_tokens
        outcome.completion_tokens = sum(g.completion_tokens for g in generations)
        outcome.cached_tokens = first.cached_tokens
        outcome.cached_ram_tokens = first.cached_ram_tokens
        outcome.cached_disk_tokens = first.cached_disk_tokens
        outcome.parked_ms = max(g.parked_ms for g in generations)  # samples parked apart: the longest wait
        if all(g.finish_reason == "cancelled" for g in generations):
            outcome.status = JobStatus.CANCELLED


def _finished(running: _Running, outcome: store.Outcome, *, host: str, slot: str) -> FinishedJob:
    """What the metrics count for this job, once its outcome is written."""
    claimed = running.claimed
    wait_s = (claimed.started_at - claimed.created_at).total_seconds() if claimed.created_at else None
    return FinishedJob(
        model=claimed.model,
        kind=claimed.kind,
        status=outcome.status.value,
        queue_wait_s=wait_s,
        run_s=outcome.run_ms / 1000 if outcome.run_ms is not None else None,
        completion_tokens=outcome.completion_tokens,
        parks=running.parks,
        resumes=running.resumes,
        host=host,
        slot=slot,
        prompt_tokens=outcome.prompt_tokens,
        cached_tokens=outcome.cached_tokens,
    )


def _end(outcome: store.Outcome, generation: Generation | None) -> End:
    """The end event of an interactive call's job, published once its outcome is committed."""
    return end_of_job(
        outcome.status.value,
        outcome.result,
        error=outcome.error,
        prompt_tokens=outcome.prompt_tokens,
        completion_tokens=outcome.completion_tokens,
        cached_tokens=outcome.cached_tokens,
        load_ms=outcome.load_ms,
        run_ms=outcome.run_ms,
        prompt_ms=generation.prompt_ms if generation is not None else None,
        eval_ms=generation.eval_ms if generation is not None else None,
    )
