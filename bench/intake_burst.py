"""Live sequences during a burst of admissions: does taking new jobs stall the ones decoding?

Four long generations decode in a run of one worker's engine (K=8); then 32 short jobs
arrive at once and are taken while slots free up: each is claimed in SQL, its prompt
tokenised, its request handed to the engine, its outcome written, all on the run's desk
thread (``worker/batching.py``). The run is gpuq's own (``GenerationRun``, the real runner,
writer, SQL and model); only RQ's worker is replaced by a host serving the jobs from a list,
as tests/worker/test_batching.py does. The clock is the engine's: the time between two steps
is the inter-token gap of every long sequence. Reported: the gap's median outside the burst
(the WINDOW steps before it and the WINDOW after), its p99 while burst jobs are in the run,
and how much of a step llama_decode took in each (the burst's own prompts must be decoded
too: one-token prompts and one token each, so that what is measured is the intake, not their
compute). Then the same burst admitted straight into the engine, with nothing beside it: on
a host whose cores llama.cpp's threads already fill, the intake's own CPU (claims, outcomes,
Python) slows llama_decode itself, and this tells the engine's part from that.

``--peer`` runs the same burst on llama.cpp's own server (``-np 8``, the same model and
threads): four streamed long answers, then 32 short requests at once after the first stream's
80th token; the gaps are the streams' token arrivals at the client. It shows what the burst's
own prompts cost on this hardware whatever the intake.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median, quantiles
from typing import Any

from bench.peer import LlamaServer
from gpuq import store
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import JobKind
from gpuq.jobs.generation_params import GenerationParams
from gpuq.registry.bundled import BUNDLED_MODEL_NAME, require_bundled_model_path
from worker.batching import GenerationRun, Started
from worker.catalog import ModelInfo
from worker.engine import LoadedModel
from worker.model_cache import ModelCache
from worker.outcome_writer import OutcomeWriter
from worker.runner import JobRunner

LONG_PROMPT, LONG_TOKENS = "Count from 1 to 5000: 1, 2, 3,", 500
LONG = {"prompt": LONG_PROMPT, "max_tokens": LONG_TOKENS, "temperature": 0.0, "stop": []}
SHORT = {"prompt": "Hi", "max_tokens": 1, "temperature": 0.0, "stop": []}
BEFORE_STEPS = 80  # steps of the long sequences alone before the burst arrives
# Gaps on each side of the burst whose median is the gap "outside" it: a step costs more as its
# sequences' positions grow (attention reads every cell: ~23 ms at step 50 here, ~25 at 110),
# so the steps next to the burst, before and after it, are what its steps would cost without it.
WINDOW = 20
N_CTX = 1024  # each sequence's context, in gpuq's run and in the engine alone


@dataclass
class _Job:
    id: str


@dataclass
class _Queue:
    name: str = f"gpuq:{BUNDLED_MODEL_NAME}:generate:high"


@dataclass
class _ListHost:
    runner: JobRunner
    long: list[str]
    burst: list[str]
    job_timeout_s: float = 3600.0
    burst_open: threading.Event = field(default_factory=threading.Event)

    def may_take_more(self) -> bool:
        return True

    def next_waiting(self, model: str, kind: str) -> tuple[Any, Any] | None:
        if self.long:
            return _Job(self.long.pop(0)), _Queue()
        if self.burst_open.is_set() and self.burst:
            return _Job(self.burst.pop(0)), _Queue()
        return None

    def put_back(self, job: Any, queue: Any) -> None:
        raise AssertionError("nothing here runs alone")

    def must_run_alone(self, job: Any) -> bool:
        return False

    def start(self, job: Any, queue: Any) -> Started | None:
        claimed = self.runner.claim(job.id)
        return None if claimed is None else Started(job, queue, None, threading.Event(), claimed)  # type: ignore[arg-type]

    def end(self, job: Any, execution: Any) -> None:
        pass

    def fail(self, job: Any, queue: Any, execution: Any) -> None:
        pass


@dataclass(frozen=True)
class BurstResult:
    gap_ms_outside: float  # median of the WINDOW gaps before the burst and the WINDOW after
    gap_ms_during_p99: float
    gap_ms_during_median: float
    decode_ms_outside: float  # median time inside llama_decode a step
    decode_ms_during: float
    admitted: int

    @property
    def ratio(self) -> float:
        return self.gap_ms_during_p99 / self.gap_ms_outside


def run(
    database_url: str, workdir: Path, *, threads: int, burst: int = 32, flash_attn: bool = True, gpu_layers: int = 0
) -> BurstResult:
    engine = sync_engine(database_url)
    sessions = sync_sessions(engine)
    writer = OutcomeWriter(sessions)
    writer.start()
    with sessions() as s:
        model = store.get_model(s, BUNDLED_MODEL_NAME)
        assert model is not None
        info = ModelInfo(model.name, model.path, N_CTX, model.vram_mib)
        rows = store.insert_jobs(
            s,
            [_new(LONG) for _ in range(4)] + [_new(SHORT) for _ in range(burst)],
        )
    ids = [r.id for r in rows]
    steps: list[tuple[float, float, bool]] = []  # (end of step, llama_decode seconds in it, burst live)
    burst_ids = set(ids[4:])
    host: _ListHost

    def load(spec: Any) -> LoadedModel:
        loaded = LoadedModel(
            spec.path,
            n_ctx=spec.n_ctx,
            embedding=False,
            threads=threads,
            gpu_layers=gpu_layers,
            slots=8,
            flash_attn=flash_attn,
        )
        decoder = loaded.decoder
        assert decoder is not None
        step = decoder.step

        def timed_step() -> Any:
            before = decoder.decode_seconds
            out = step()
            live = bool(burst_ids & set(decoder.live_keys())) or (host.burst_open.is_set() and bool(host.burst))
            steps.append((time.perf_counter(), decoder.decode_seconds - before, live))
            if len(steps) == BEFORE_STEPS:
                host.burst_open.set()
            return out

        decoder.step = timed_step  # type: ignore[method-assign]
        return loaded

    runner = JobRunner(
        sessions=sessions,
        models=lambda _name: info,
        cache=ModelCache(load, max_loaded=1),
        writer=writer,
        worker_name="bench",
        device="cpu",
    )
    host = _ListHost(runner, ids[1:4], ids[4:])
    GenerationRun(host, _Queue(), BUNDLED_MODEL_NAME, JobKind.GENERATE.value).run(_Job(ids[0]))  # type: ignore[arg-type]
    writer.stop()
    engine.dispose()
    return _result(steps, burst - len(host.burst))


def run_engine_alone(*, threads: int, burst: int = 32, flash_attn: bool = True, gpu_layers: int = 0) -> BurstResult:
    """The same burst admitted straight into the engine, with no claim, SQL, outcome or thread
    beside it: what the engine's own steps cost, apart from the intake's CPU on this host."""
    model = LoadedModel(
        str(require_bundled_model_path()), n_ctx=N_CTX, embedding=False, threads=threads, gpu_layers=gpu_layers,
        slots=8, flash_attn=flash_attn,
    )  # fmt: skip
    decoder = model.decoder
    assert decoder is not None
    steps: list[tuple[float, float, bool]] = []
    waiting = [f"short{i}" for i in range(burst)]
    try:
        for i in range(4):
            model.prepare(f"long{i}", GenerationParams.model_validate(LONG), threading.Event(), None).admit()
        while decoder.active:
            if len(steps) >= BEFORE_STEPS:
                while waiting and decoder.free_slots:
                    short = GenerationParams.model_validate(SHORT)
                    model.prepare(waiting.pop(0), short, threading.Event(), None).admit()
            before = decoder.decode_seconds
            decoder.step()
            live = any(key.startswith("short") for key in decoder.live_keys()) or (
                len(steps) >= BEFORE_STEPS and bool(waiting)
            )
            steps.append((time.perf_counter(), decoder.decode_seconds - before, live))
    finally:
        model.close()
    return _result(steps, burst - len(waiting))


def _result(steps: list[tuple[float, float, bool]], admitted: int) -> BurstResult:
    """From each step's (end, llama_decode seconds in it, burst jobs live): each step's gap
    from the step before it, labelled by whether burst jobs were in the run."""
    gaps = [((b[0] - a[0]) * 1000, b[1] * 1000, b[2]) for a, b in itertools.pairwise(steps)]
    live = [i for i, (_g, _d, burst_live) in enumerate(gaps) if burst_live]
    first, last = live[0], live[-1]
    outside = gaps[first - WINDOW : first] + gaps[last + 1 : last + 1 + WINDOW]
    assert len(outside) == 2 * WINDOW and not any(burst_live for _g, _d, burst_live in outside)
    during = gaps[first : last + 1]
    return BurstResult(
        median(g for g, _d, _l in outside),
        quantiles([g for g, _d, _l in during], n=100, method="inclusive")[98],
        median(g for g, _d, _l in during),
        median(d for _g, d, _l in outside),
        median(d for _g, d, _l in during),
        admitted,
    )


def _new(request: dict[str, Any]) -> store.NewJob:
    return store.NewJob(
        id=store.new_job_id(), kind="generate", model=BUNDLED_MODEL_NAME, priority=0, request=request, request_hash="b"
    )


@dataclass(frozen=True)
class PeerBurst:
    gap_ms_outside: float  # median of each stream's WINDOW gaps before the burst and WINDOW after
    gap_ms_during_median: float
    gap_ms_during_p99: float
    answered: int

    @property
    def ratio(self) -> float:
        return self.gap_ms_during_p99 / self.gap_ms_outside


def run_on_llama_server(binary: str, workdir: Path, *, threads: int, burst: int = 32) -> PeerBurst:
    server = LlamaServer(binary, slots=8, threads=threads, log=workdir / "llama-server-burst.log")
    try:
        server.complete("Hello")  # warm, as gpuq's side loads its model first
        arrivals: list[list[float]] = [[] for _ in range(4)]
        started_80 = threading.Event()

        def stream(times: list[float]) -> None:
            for _ in server.stream(LONG_PROMPT, LONG_TOKENS):
                times.append(time.perf_counter())
                if len(times) == BEFORE_STEPS:
                    started_80.set()

        longs = [threading.Thread(target=stream, args=(times,)) for times in arrivals]
        for t in longs:
            t.start()
        started_80.wait(timeout=600)
        burst_start = time.perf_counter()
        answered: list[int] = []
        shorts = [
            threading.Thread(target=lambda: answered.append(server.complete("Hi", n_predict=1))) for _ in range(burst)
        ]
        for t in shorts:
            t.start()
        for t in shorts:
            t.join()
        burst_end = time.perf_counter()
        for t in longs:
            t.join()
    finally:
        server.close()
    # Each token's gap from the one before it in its stream, by when it arrived.
    outside: list[float] = []
    during: list[float] = []
    for times in arrivals:
        gaps = [((b - a) * 1000, b) for a, b in itertools.pairwise(times)]
        outside += [g for g, at in gaps if at < burst_start][-WINDOW:]
        outside += [g for g, at in gaps if at > burst_end][:WINDOW]
        during += [g for g, at in gaps if burst_start <= at <= burst_end]
    return PeerBurst(median(outside), median(during), quantiles(during, n=100, method="inclusive")[98], len(answered))
