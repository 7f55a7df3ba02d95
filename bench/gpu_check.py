"""The checks that need a real NVIDIA GPU, as one table (`scripts/gpu_check.sh` runs it).

* CUDA build: llama.cpp in this venv offloads to a GPU (the script built it in a clean venv).
* NVML discovery: gpuq's discovery finds the GPU through pynvml, with its telemetry.
* VRAM estimate vs NVML: gpuq's estimate for SmolLM2 (K=1, 2,048 tokens) is within -10 % /
  +35 % of the memory NVML reports for a process that loaded it fully offloaded.
* pinned worker vs direct: a worker pinned to the GPU by UUID makes >= 0.9x the tokens/s of
  llama-cpp-python on the same GPU, and records ``cuda:<uuid>``.
* continuous batching K=8: gpuq at K=8 makes >= 0.9x the tokens/s of the direct batched loop.
* energy per job: each job's ``energy_j`` is within 0.8x-1.25x of NVML power (sampled here
  every 0.1 s) x its ``gpu_seconds``.
* GPU telemetry: ``/metrics`` has the GPU's power and utilisation gauges, and ``gpu_samples``
  has rows with power.
* seeded texts: the same seeded requests, with flash attention on (the worker's default),
  give the same texts with and without prompt-cache hits on the GPU (the engine's promise: a
  miss), and whether they also match at K=1, 8 and 16 is reported (a GPU may pick other
  kernels for other batch sizes: reported, not judged).
* peer: gpuq against llama.cpp's own server built for CUDA (scripts/build_llama_server.sh) on
  bench/peer.py's W1, W2 and W3 (8 prompt families, more than the slots: the prefix
  cache's RAM tier against llama-server's ``--cache-ram``) at K=8, >= 1.0x jobs/s on each.
* intake burst: bench/intake_burst.py on the GPU (four long generations at K=8, then 32 jobs
  taken while they decode): the long sequences' inter-token gap p99 during the burst <= 1.3x
  its median outside it; the engine alone's figure, with no intake beside it, is shown. On
  the CPU the burst's own prompt rows put the engine alone above 1.3x (a fifth row on four
  costs ~22 % there); on a GPU a few more rows cost next to nothing.

A step that raises is a miss with its error; the others still run. Exits 0 when every row
passes, 1 on any miss, 2 when no GPU is visible at all. ``--cpu-dry-run`` runs the same
judging and table on canned figures, on any machine (``--miss NAME`` makes that row's
figure fail), so the table and the exit code are tested without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VRAM_UNDER = 0.10  # an estimate this much under NVML's figure risks out-of-memory: a miss
VRAM_OVER = 0.35  # this much over wastes GPUs: a miss
WORKER_RATIO = 0.9
BATCHING_RATIO = 0.9
ENERGY_RANGE = (0.8, 1.25)
BATCH_SLOTS = 8
PEER_RATIO = 1.0
BURST_RATIO = 1.3
RESTORE_RATIO = 0.5  # a start restored from RAM or disk, against prefilling it
REDIS_URL = os.environ.get("GPUQ_REDIS_URL", "redis://127.0.0.1:6379/11")


@dataclass(frozen=True, slots=True)
class Row:
    check: str
    target: str
    measured: str
    ok: bool


# ---------------------------------------------------------------- judging (pure)


def judge_build(gpu_devices: int) -> Row:
    return Row("CUDA build", "llama.cpp offloads to >= 1 GPU", f"{gpu_devices} GPU(s)", gpu_devices >= 1)


def judge_discovery(gpus: list[str]) -> Row:
    return Row("NVML discovery", ">= 1 GPU through pynvml", "; ".join(gpus) or "none", bool(gpus))


def judge_vram(estimate_mib: float, measured_mib: float | None) -> Row:
    target = f"estimate within -{VRAM_UNDER:.0%} / +{VRAM_OVER:.0%} of NVML"
    if not measured_mib:
        return Row("VRAM estimate vs NVML", target, f"estimate {estimate_mib:.0f} MiB, NVML: no figure", False)
    error = (estimate_mib - measured_mib) / measured_mib
    measured = f"estimate {estimate_mib:.0f} MiB, NVML {measured_mib:.0f} MiB ({error:+.1%})"
    return Row("VRAM estimate vs NVML", target, measured, -VRAM_UNDER <= error <= VRAM_OVER)


def judge_worker(direct_tps: float, ours_tps: float, devices: set[str], uuid: str) -> Row:
    ratio = ours_tps / direct_tps
    measured = f"direct {direct_tps:.1f}, gpuq {ours_tps:.1f} tok/s ({ratio:.2f}x); devices {','.join(sorted(devices))}"
    ok = ratio >= WORKER_RATIO and devices == {f"cuda:{uuid}"}
    return Row("pinned worker vs direct", f">= {WORKER_RATIO}x, device cuda:<uuid>", measured, ok)


def judge_batching(direct_tps: float, ours_tps: float, alone_tps: float) -> Row:
    ratio = ours_tps / direct_tps
    measured = (
        f"direct {direct_tps:.1f}, gpuq {ours_tps:.1f} tok/s ({ratio:.2f}x); gpuq K=1 {alone_tps:.1f} "
        f"({ours_tps / alone_tps:.2f}x scaling)"
    )
    return Row(
        f"continuous batching K={BATCH_SLOTS}",
        f">= {BATCHING_RATIO}x the direct loop",
        measured,
        ratio >= BATCHING_RATIO,
    )


def judge_energy(jobs: list[tuple[float | None, float | None]]) -> Row:
    """``jobs``: (energy_j recorded, NVML mean power x gpu_seconds) per job."""
    low, high = ENERGY_RANGE
    ratios = [e / x if e and x else None for e, x in jobs]
    measured = ", ".join("no figure" if r is None else f"{r:.2f}x" for r in ratios) or "no jobs"
    ok = bool(ratios) and all(r is not None and low <= r <= high for r in ratios)
    return Row("energy per job", f"{low}x-{high}x of power x time", measured, ok)


def judge_seeded(cache_same: bool, k_same: dict[int, bool]) -> Row:
    across = ", ".join(f"K={k} {'same' if same else 'differs'}" for k, same in sorted(k_same.items()))
    measured = f"with/without cache hits {'same' if cache_same else 'DIFFER'}; vs K=1: {across}"
    return Row("seeded texts", "same with or without cache hits", measured, cache_same)


def judge_peer(w1: float, w2: float, w3: float) -> Row:
    measured = f"W1 {w1:.2f}x, W2 {w2:.2f}x, W3 {w3:.2f}x jobs/s"
    return Row(
        f"peer: gpuq vs llama-server K={BATCH_SLOTS}",
        f">= {PEER_RATIO:.1f}x on W1, W2 and W3",
        measured,
        min(w1, w2, w3) >= PEER_RATIO,
    )


def judge_restore(ram: float, disk: float) -> Row:
    """``ram``, ``disk``: time to the first token with the start restored, over prefilling it."""
    measured = f"RAM {ram:.3f}x, disk {disk:.3f}x of the prefill"
    return Row("prefix cache restore", f"<= {RESTORE_RATIO}x the prefill", measured, max(ram, disk) <= RESTORE_RATIO)


def judge_preemption(same: bool, parked: int) -> Row:
    """``same``: every parked job's text the one it gives never parked; ``parked``: how many were."""
    measured = f"{parked} parked and resumed, texts {'same' if same else 'DIFFER'}"
    return Row("preemption", "parked texts same as never parked", measured, same and parked > 0)


def judge_burst(ours: float, alone: float) -> Row:
    """``ours``, ``alone``: gap p99 during the burst / median outside it, gpuq's and the engine alone's."""
    measured = f"gpuq {ours:.2f}x, the engine alone {alone:.2f}x"
    return Row("intake burst", f"gap p99 / median <= {BURST_RATIO}x", measured, ours <= BURST_RATIO)


def judge_telemetry(gauges: list[str], samples_with_power: int) -> Row:
    measured = f"{len(gauges)} gauge line(s), {samples_with_power} gpu_samples row(s) with power"
    return Row(
        "GPU telemetry", "/metrics power+utilisation, gpu_samples", measured, bool(gauges) and samples_with_power > 0
    )


def render(rows: list[Row]) -> str:
    headers = ("check", "result", "target", "measured")
    cells = [(r.check, "ok" if r.ok else "MISS", r.target, r.measured) for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(cell, widths, strict=True)).rstrip() for cell in cells]
    return "\n".join(lines)


def exit_code(rows: list[Row]) -> int:
    return 0 if rows and all(r.ok for r in rows) else 1


def guarded(check: str, step: Callable[[], Row]) -> Row:
    """A step that raises is that check's miss, with the error; the other checks still run."""
    try:
        return step()
    except Exception as exc:
        return Row(check, "runs", f"failed: {type(exc).__name__}: {str(exc)[:200]}", False)


# ---------------------------------------------------------------- the dry run


def dry_run_rows(miss: set[str]) -> list[Row]:
    """Canned figures through the same judging: passing ones, or failing ones for ``miss``."""
    bad = miss.__contains__
    uuid = "GPU-00000000-dry-run"
    return [
        judge_build(0 if bad("build") else 1),
        judge_discovery([] if bad("discovery") else [f"0: dry run {uuid}"]),
        judge_vram(1040.0, 1400.0 if bad("vram") else 1000.0),
        judge_worker(300.0, 200.0 if bad("worker") else 290.0, {f"cuda:{uuid}"}, uuid),
        judge_batching(1500.0, 900.0 if bad("batching") else 1450.0, 300.0),
        judge_energy([(300.0, 150.0 if bad("energy") else 290.0), (310.0, 305.0)]),
        judge_telemetry([] if bad("telemetry") else ["gpuq_gpu_power_watts 300"], 3),
        judge_seeded(not bad("seeded"), {8: True, 16: False}),
        judge_peer(1.1, 0.8 if bad("peer") else 2.5, 1.2),
        judge_burst(1.6 if bad("burst") else 1.1, 1.05),
        judge_restore(0.04, 0.9 if bad("restore") else 0.06),
        judge_preemption(not bad("preemption"), 2),
    ]


DRY_RUN_CHECKS = (
    "build",
    "discovery",
    "vram",
    "worker",
    "batching",
    "energy",
    "telemetry",
    "seeded",
    "peer",
    "burst",
    "restore",
    "preemption",
)


# ---------------------------------------------------------------- measuring, on a GPU

_LOAD_AND_REPORT = """
import os, sys, json, pynvml, llama_cpp
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=int(sys.argv[2]), n_gpu_layers=-1, verbose=False)
llm.create_completion("warm up", max_tokens=4)
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByUUID(sys.argv[3])
mine = [p for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid == os.getpid()]
print(json.dumps({"used_bytes": mine[0].usedGpuMemory if mine else None}))
"""


def measured_vram_mib(uuid: str) -> float | None:
    from gpuq.registry.bundled import BUNDLED_CONTEXT_LENGTH, require_bundled_model_path

    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": uuid}
    out = subprocess.run(
        [sys.executable, "-c", _LOAD_AND_REPORT, str(require_bundled_model_path()), str(BUNDLED_CONTEXT_LENGTH), uuid],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    used = json.loads(out.stdout.strip().splitlines()[-1])["used_bytes"]
    return used / 2**20 if used else None


def check_vram(uuid: str) -> Row:
    from gpuq.fleet.vram import estimate_generation
    from gpuq.registry.bundled import BUNDLED_CONTEXT_LENGTH, require_bundled_model_path
    from gpuq.registry.gguf import read_metadata

    shape = read_metadata(require_bundled_model_path()).shape
    estimate = estimate_generation(shape, n_ctx=BUNDLED_CONTEXT_LENGTH, slots=1)  # as llama_cpp.Llama's context
    return judge_vram(estimate.total_mib, measured_vram_mib(uuid))


def check_worker(uuid: str) -> Row:
    from bench import generation
    from bench.__main__ import fresh_system_state

    direct = generation.run_direct(threads=4, max_tokens=128, gpu_layers=-1)
    with fresh_system_state(REDIS_URL, None) as (redis_url, db, workdir):
        ours = generation.run_gpuq(db, redis_url, workdir, threads=4, max_tokens=128, gpus=uuid)
        devices = _devices(db)
    return judge_worker(direct.tokens_per_s, ours.tokens_per_s, devices, uuid)


def _devices(database_url: str) -> set[str]:
    from gpuq.db.engine import sync_engine, sync_sessions
    from gpuq.db.tables import Job

    engine = sync_engine(database_url)
    with sync_sessions(engine)() as session:
        devices = {d for (d,) in session.query(Job.device).filter(Job.kind == "generate")}
    engine.dispose()
    return {d for d in devices if d}


def check_batching(uuid: str) -> Row:
    from bench import batching
    from bench.__main__ import fresh_system_state

    direct = batching.run_direct_batched(slots=BATCH_SLOTS, threads=4, max_tokens=64, gpu_layers=-1)
    ours = {}
    for k in (1, BATCH_SLOTS):
        with fresh_system_state(REDIS_URL, None) as (redis_url, db, workdir):
            ours[k] = batching.run_gpuq(db, redis_url, workdir, slots=k, threads=4, max_tokens=64, gpus=uuid)
    return judge_batching(direct.tokens_per_s, ours[BATCH_SLOTS].tokens_per_s, ours[1].tokens_per_s)


def _gpu_engine(slots: int, *, prompt_cache: bool = True) -> Any:
    """The bundled model in the engine, every layer on the GPU (a LoadedModel)."""
    from gpuq.registry.bundled import require_bundled_model_path
    from worker.engine import LoadedModel

    return LoadedModel(
        str(require_bundled_model_path()), n_ctx=2048, embedding=False, threads=4, gpu_layers=-1,
        slots=slots, prompt_cache=prompt_cache,
    )  # fmt: skip


def check_seeded(uuid: str) -> Row:
    """The same seeded requests (sharing a long start) through the engine on the GPU: with the
    cache off at K=1 (the reference), with it on at K=1, 8 and 16."""
    import threading

    from bench.peer import W2
    from gpuq.jobs.generation_params import GenerationParams

    requests = {
        f"r{i}": {"prompt": p, "max_tokens": 32, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": i}
        for i, p in enumerate(W2[:16])
    }

    def texts(slots: int, reuse: bool) -> dict[str, str]:
        model = _gpu_engine(slots, prompt_cache=reuse)
        decoder = model.decoder
        assert decoder is not None
        pending, done = list(requests.items()), {}
        while pending or decoder.active:
            while pending and decoder.free_slots:
                key, request = pending.pop(0)
                model.prepare(key, GenerationParams.model_validate(request), threading.Event()).admit()
            for finished in decoder.step():
                assert finished.generation is not None, finished.error
                done[finished.key] = finished.generation.text
        model.close()
        return done

    reference = texts(1, reuse=False)
    cached = {k: texts(k, reuse=True) for k in (1, BATCH_SLOTS, 16)}
    return judge_seeded(cached[1] == reference, {k: cached[k] == reference for k in (BATCH_SLOTS, 16)})


def check_restore() -> Row:
    """``bench restore`` on the GPU: a ~450-token start prefilled, or restored from RAM and disk."""
    from statistics import median

    from bench import restore

    figures = restore.run(rounds=3, threads=4, gpu_layers=-1)
    prefill = median(figures.first_token_ms["prefilled"])
    ram = median(figures.first_token_ms["from RAM"]) / prefill
    disk = median(figures.first_token_ms["from disk, cold"]) / prefill
    return judge_restore(ram, disk)


def check_preemption() -> Row:
    """Low-priority seeded jobs on every slot, two of them parked for urgent ones mid-answer and
    resumed, against the same jobs never parked, on the GPU."""
    import threading

    from bench.peer import W2
    from gpuq.jobs.generation_params import GenerationParams

    lows = {
        f"low{i}": {"prompt": p, "max_tokens": 48, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "seed": i}
        for i, p in enumerate(W2[:BATCH_SLOTS])
    }
    urgent = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0.0}

    def texts(park: bool) -> tuple[dict[str, str], int]:
        model = _gpu_engine(BATCH_SLOTS)
        decoder = model.decoder
        assert decoder is not None
        for key, request in lows.items():
            model.prepare(key, GenerationParams.model_validate(request), threading.Event(), priority=2).admit()
        done: dict[str, str] = {}
        for step in range(200):
            if step == 20 and park:
                parked = decoder.park_for(0, 2)
                for i in range(parked):
                    params = GenerationParams.model_validate(urgent)
                    model.prepare(f"urgent{i}", params, threading.Event(), priority=0).admit()
            for finished in decoder.step():
                assert finished.generation is not None, finished.error
                done[finished.key] = finished.generation.text
            if not decoder.active:
                break
        parks = decoder.parks
        model.close()
        return {k: v for k, v in done.items() if k.startswith("low")}, parks

    reference, _ = texts(park=False)
    parked, parks = texts(park=True)
    return judge_preemption(parked == reference, parks)


def check_peer(uuid: str, compute_capability: str | None) -> Row:
    from bench import peer
    from bench.__main__ import fresh_system_state

    arch = (compute_capability or "9.0").replace(".", "")
    env = os.environ | {"CMAKE_ARGS": f"-DGGML_CUDA=on -DGGML_NATIVE=OFF -DCMAKE_CUDA_ARCHITECTURES={arch}"}
    project = Path(__file__).resolve().parent.parent
    built = subprocess.run(
        [str(project / "scripts" / "build_llama_server.sh")], env=env, check=True, capture_output=True, text=True
    )
    binary = built.stdout.strip().splitlines()[-1]
    ratios = {}
    for name, prompts in peer.WORKLOADS.items():
        with fresh_system_state(REDIS_URL, None) as (_redis_url, _db, workdir):
            server = peer.run_llama_server(
                binary, prompts, slots=BATCH_SLOTS, threads=4, workdir=workdir, gpu_layers=99
            )
        with fresh_system_state(REDIS_URL, None) as (redis_url, db, workdir):
            ours = peer.run_gpuq(db, redis_url, workdir, prompts, slots=BATCH_SLOTS, threads=4, reuse=True, gpus=uuid)
        ratios[name] = ours.jobs_per_s / server.jobs_per_s
    return judge_peer(ratios["W1"], ratios["W2"], ratios["W3"])


def check_burst() -> Row:
    """Three rounds of each, medians, as ``bench intake-burst`` reports them."""
    from statistics import median

    from bench import intake_burst
    from bench.__main__ import fresh_system_state

    ours, alone = [], []
    for _ in range(3):
        with fresh_system_state(REDIS_URL, None) as (_redis_url, db, workdir):
            ours.append(intake_burst.run(db, workdir, threads=4, gpu_layers=-1).ratio)
        alone.append(intake_burst.run_engine_alone(threads=4, gpu_layers=-1).ratio)
    return judge_burst(median(ours), median(alone))


class PowerWatch:
    """NVML power of one GPU, sampled every 0.1 s by this script (independently of gpuq)."""

    def __init__(self, uuid: str) -> None:
        import pynvml

        pynvml.nvmlInit()
        self._nvml, self._handle = pynvml, pynvml.nvmlDeviceGetHandleByUUID(uuid)
        self.readings: list[tuple[float, float]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(0.1):
            self.readings.append((time.time(), self._nvml.nvmlDeviceGetPowerUsage(self._handle) / 1000))

    def mean_watts(self, start: float, end: float) -> float | None:
        inside = [w for t, w in self.readings if start <= t <= end]
        return sum(inside) / len(inside) if inside else None

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def check_energy_and_telemetry(uuid: str, gpu_count: int) -> list[Row]:
    """A supervisor on this host (NVML discovery, a worker pinned per GPU, telemetry to Redis
    and SQL) runs three long generations; their energy against NVML power x time."""
    import httpx

    from gpuq import store
    from gpuq.db import migrate
    from gpuq.db.engine import sync_engine, sync_sessions
    from gpuq.registry.models import register_bundled_model
    from gpuq.testing import GpuqProcesses

    with tempfile.TemporaryDirectory(prefix="gpuq-energy-") as tmp:
        workdir = Path(tmp)
        (workdir / "models").mkdir()
        database_url = f"sqlite:///{workdir / 'gpuq.db'}"
        migrate.upgrade(database_url)
        engine = sync_engine(database_url)
        with sync_sessions(engine)() as session:
            register_bundled_model(session)
        engine.dispose()
        processes = GpuqProcesses(database_url, REDIS_URL, workdir, settings={"GPUQ_GPU_SAMPLE_INTERVAL_S": "2"})
        watch = PowerWatch(uuid)
        try:
            _api, url = processes.start_api()
            processes.start_supervisor(expected_workers=gpu_count)
            body = {"kind": "generate", "model": "smollm2-135m", "prompt": "Tell a long story.", "max_tokens": 1800}
            with processes.client(url) as client:
                rule = {"model_pattern": "smollm2-135m", "effect": "allow", "gpu_uuids": [uuid]}
                client.add_rule(rule)  # the jobs run on the GPU watched here
                time.sleep(6)  # workers re-read rules every 5 s
                ids = [client.submit(body | {"seed": i, "temperature": 0.8})["id"] for i in range(3)]
                jobs = [client.wait(i, timeout_s=300) for i in ids]
            scrape = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {processes.admin_key}"}).text
            engine = sync_engine(database_url)
            with sync_sessions(engine)() as session:
                history = store.gpu_samples(session, gpu_uuid=uuid)
            engine.dispose()
        finally:
            watch.stop()
            processes.stop_all()
    pairs = []
    for job in jobs:
        watts = watch.mean_watts(_epoch(job["started_at"]), _epoch(job["finished_at"]))
        pairs.append((job["energy_j"], watts * job["gpu_seconds"] if watts and job["gpu_seconds"] else None))
    gauges = [line for line in scrape.splitlines() if line.startswith(("gpuq_gpu_power_watts", "gpuq_gpu_utilization"))]
    return [judge_energy(pairs), judge_telemetry(gauges, sum(1 for r in history if r.power_w is not None))]


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


def measure() -> list[Row] | None:
    """Every check on this host's first GPU; None when NVML shows no GPU at all."""
    from gpuq.fleet.gpus import discover_gpus
    from worker.device import llama_gpu_devices

    inventory = discover_gpus(host=os.uname().nodename)
    if inventory.source != "nvml" or not inventory.gpus:
        return None
    gpu = inventory.gpus[0]
    described = [
        f"{g.index}: {g.name} {g.uuid} {g.memory_total_mib} MiB, CC {g.compute_capability}, {g.power_w} W"
        for g in inventory.gpus
    ]
    rows = [guarded("CUDA build", lambda: judge_build(llama_gpu_devices())), judge_discovery(described)]
    rows.append(guarded("VRAM estimate vs NVML", lambda: check_vram(gpu.uuid)))
    rows.append(guarded("pinned worker vs direct", lambda: check_worker(gpu.uuid)))
    rows.append(guarded(f"continuous batching K={BATCH_SLOTS}", lambda: check_batching(gpu.uuid)))
    rows.append(guarded("seeded texts", lambda: check_seeded(gpu.uuid)))
    rows.append(
        guarded(f"peer: gpuq vs llama-server K={BATCH_SLOTS}", lambda: check_peer(gpu.uuid, gpu.compute_capability))
    )
    rows.append(guarded("intake burst", check_burst))
    rows.append(guarded("prefix cache restore", check_restore))
    rows.append(guarded("preemption", check_preemption))
    try:
        rows += check_energy_and_telemetry(gpu.uuid, len(inventory.gpus))
    except Exception as exc:
        rows.append(Row("energy per job", "runs", f"failed: {type(exc).__name__}: {str(exc)[:200]}", False))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.split("\n")[0])
    parser.add_argument("--cpu-dry-run", action="store_true", help="judge canned figures: no GPU needed")
    parser.add_argument("--miss", action="append", default=[], choices=DRY_RUN_CHECKS, help="dry run: fail this row")
    args = parser.parse_args(argv)
    if args.miss and not args.cpu_dry_run:
        parser.error("--miss only goes with --cpu-dry-run")
    started = time.monotonic()
    rows: Any = dry_run_rows(set(args.miss)) if args.cpu_dry_run else measure()
    if rows is None:
        print("no NVIDIA GPU visible through NVML: this check needs one (see scripts/gpu_check.sh)")
        return 2
    print(("DRY RUN on canned figures: nothing was measured\n" if args.cpu_dry_run else "") + render(rows))
    misses = [r.check for r in rows if not r.ok]
    print(f"{len(rows) - len(misses)} of {len(rows)} checks pass" + (f"; MISS: {', '.join(misses)}" if misses else ""))
    print(f"done in {time.monotonic() - started:.0f} s")
    return exit_code(rows)


if __name__ == "__main__":
    sys.exit(main())
