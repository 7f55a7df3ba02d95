"""gpuq against llama.cpp's own server on the same work: the outside anchor.

``llama-server`` is built by ``scripts/build_llama_server.sh`` from the llama.cpp that the
pinned llama-cpp-python vendors, with the wheel's CPU flags (same kernels), and run with
``-np K``, the same threads, the same per-slot context and the same model. Its prompt cache
is on, as it is by default. Two workloads of 64 jobs, greedy, 64 tokens each:

* **W1**: distinct ~30-token prompts (``bench.batching.PROMPTS``);
* **W2**: prompts sharing a ~450-token few-shot start, each ending in its own question (a
  batch eval's shape);
* **W3**: 8 prompt families, each its own ~450-token few-shot start (the same pairs in
  another order, under its own heading), 8 questions each, interleaved as a batch file often
  is: more starts than slots, so only a cache beyond the slots (llama-server's ``--cache-ram``,
  gpuq's prefix cache) keeps them.

gpuq gets each workload as one bulk submission to one worker with ``GPUQ_WORKER_SLOTS=K``;
llama-server gets K concurrent clients, each taking the next prompt when its last answer
came. The clock runs from the first submission to the last answer (gpuq: the last recorded
finish). W2 also runs through gpuq with prompt reuse off, W3 with the prefix cache's RAM tier
off (the slots alone). Both sides run with their default,
flash attention on where the backend has it; gpuq also with it off with ``--flash-attn-off``.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from bench.batching import PROMPTS as W1
from bench.generation import run_through_gpuq
from gpuq.local.redis_server import free_port
from gpuq.registry.bundled import BUNDLED_CONTEXT_LENGTH, BUNDLED_MODEL_NAME, require_bundled_model_path

MAX_TOKENS = 64
_FEW_SHOT = "".join(
    f"Question: {q}\nAnswer: {a}\n\n"
    for q, a in [
        ("What is the capital of France?", "Paris is the capital of France."),
        ("How many legs does a spider have?", "A spider has eight legs."),
        ("What colour is a ripe banana?", "A ripe banana is yellow."),
        ("Which planet is closest to the sun?", "Mercury is the planet closest to the sun."),
        ("What do bees make?", "Bees make honey and wax."),
        ("How many days are in a week?", "There are seven days in a week."),
        ("What is frozen water called?", "Frozen water is called ice."),
        ("Which animal is known as the king of the jungle?", "The lion is called the king of the jungle."),
        ("What gas do plants take in?", "Plants take in carbon dioxide from the air."),
        ("How many hours are in a day?", "There are twenty-four hours in a day."),
        ("What is the largest ocean on Earth?", "The Pacific is the largest ocean on Earth."),
        ("Which season comes after winter?", "Spring comes after winter."),
        ("What do cows drink?", "Cows drink water."),
        ("What is the opposite of hot?", "The opposite of hot is cold."),
        ("Where do fish live?", "Fish live in water, in rivers, lakes and seas."),
        ("What shape has three sides?", "A triangle has three sides."),
        ("What is two plus two?", "Two plus two is four."),
        ("Which bird cannot fly but runs fast?", "The ostrich cannot fly but runs fast."),
        ("What do we call a baby cat?", "A baby cat is called a kitten."),
        ("How many wheels does a bicycle have?", "A bicycle has two wheels."),
    ]
)
W2 = [f"{_FEW_SHOT}Question: In one sentence, what is special about {subject}?\nAnswer:" for subject in W1]
FAMILIES = 8


def family_start(family: int) -> str:
    """Family ``family``'s few-shot start: its own heading and the pairs rotated, so no two
    families share more than a few tokens."""
    pairs = _FEW_SHOT.split("\n\n")[:-1]
    shift = family * len(pairs) // FAMILIES
    return f"Quiz {family + 1}.\n\n" + "".join(f"{p}\n\n" for p in pairs[shift:] + pairs[:shift])


W3 = [
    f"{family_start(f)}Question: In one sentence, what is special about {W1[q * FAMILIES + f]}?\nAnswer:"
    for q in range(len(W1) // FAMILIES)
    for f in range(FAMILIES)
]
WORKLOADS = {"W1": W1, "W2": W2, "W3": W3}


@dataclass(frozen=True)
class Run:
    jobs: int
    completion_tokens: int
    seconds: float
    # gpuq's only: prompt tokens in all, and those taken from a KV slot, the RAM tier and disk
    prompt_tokens: int = 0
    cached: tuple[int, int, int] = (0, 0, 0)

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.seconds

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.seconds


def llama_server_binary(project: Path) -> str:
    """The cached build (made on first use: 10-15 minutes on two cores)."""
    out = subprocess.run(
        [str(project / "scripts" / "build_llama_server.sh")], check=True, capture_output=True, text=True
    )
    return out.stdout.strip().splitlines()[-1]


class LlamaServer:
    """llama.cpp's server on a loopback port, K slots of the bundled model's context each."""

    def __init__(self, binary: str, *, slots: int, threads: int, log: Path, gpu_layers: int = 0) -> None:
        self.port = free_port()
        self._log = log.open("wb")
        self._process = subprocess.Popen(
            [
                binary,
                "-m", str(require_bundled_model_path()),
                "--host", "127.0.0.1", "--port", str(self.port),
                "-np", str(slots), "-c", str(BUNDLED_CONTEXT_LENGTH * slots),
                "-t", str(threads), "-tb", str(threads),
                "--no-webui", "-ngl", str(gpu_layers),
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self._process.returncode}; see {self._log.name}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError("llama-server did not become ready in 120 s")

    def complete(self, prompt: str, n_predict: int = MAX_TOKENS) -> int:
        """A greedy answer; returns how many tokens it has."""
        with urllib.request.urlopen(self._request(prompt, n_predict, stream=False), timeout=600) as r:
            return int(json.load(r)["tokens_predicted"])

    def stream(self, prompt: str, n_predict: int) -> Iterator[None]:
        """A greedy answer streamed: yields as each token arrives."""
        with urllib.request.urlopen(self._request(prompt, n_predict, stream=True), timeout=600) as r:
            for line in r:
                if line.startswith(b"data: ") and json.loads(line[6:]).get("content"):
                    yield None

    def _request(self, prompt: str, n_predict: int, *, stream: bool) -> urllib.request.Request:
        body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "cache_prompt": True, "stream": stream}
        return urllib.request.Request(
            f"http://127.0.0.1:{self.port}/completion",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )

    def close(self) -> None:
        self._process.terminate()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
        self._log.close()


def run_llama_server(
    binary: str, prompts: list[str], *, slots: int, threads: int, workdir: Path, gpu_layers: int = 0
) -> Run:
    log = workdir / f"llama-server-{slots}.log"
    server = LlamaServer(binary, slots=slots, threads=threads, log=log, gpu_layers=gpu_layers)
    try:
        server.complete("Hello")  # warm, as gpuq's side loads its model first
        pending = list(prompts)
        lock = threading.Lock()
        tokens: list[int] = []

        def client() -> None:
            while True:
                with lock:
                    if not pending:
                        return
                    prompt = pending.pop(0)
                n = server.complete(prompt)
                with lock:
                    tokens.append(n)

        started = time.perf_counter()
        clients = [threading.Thread(target=client) for _ in range(slots)]
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        elapsed = time.perf_counter() - started
    finally:
        server.close()
    return Run(len(tokens), sum(tokens), elapsed)


def run_gpuq(
    database_url: str,
    redis_url: str,
    workdir: Path,
    prompts: list[str],
    *,
    slots: int,
    threads: int,
    reuse: bool,
    gpus: str | None = None,
    flash_attn: bool = True,
    prefix_cache: bool = True,
) -> Run:
    body = {"kind": "generate", "model": BUNDLED_MODEL_NAME, "max_tokens": MAX_TOKENS, "temperature": 0.0}
    jobs = [body | {"prompt": p, "top_p": 1.0, "seed": 7} for p in prompts]
    settings = {
        "GPUQ_WORKER_THREADS": str(threads),
        "GPUQ_WORKER_SLOTS": str(slots),
        "GPUQ_WORKER_PROMPT_CACHE": "true" if reuse else "false",
        "GPUQ_WORKER_FLASH_ATTN": "true" if flash_attn else "false",
        # its default (-1: a share of the host's memory), or off: the slots alone
        "GPUQ_WORKER_PREFIX_CACHE_RAM_BYTES": "-1" if prefix_cache else "0",
    }
    started, done = run_through_gpuq(database_url, redis_url, workdir, jobs, settings=settings, gpus=gpus)
    elapsed = (max(datetime.fromisoformat(j["finished_at"]) for j in done) - started).total_seconds()
    ram = sum(j.get("cached_ram_tokens") or 0 for j in done)
    disk = sum(j.get("cached_disk_tokens") or 0 for j in done)
    slot = sum(j.get("cached_tokens") or 0 for j in done) - ram - disk
    prompt = sum(j.get("prompt_tokens") or 0 for j in done)
    return Run(len(done), sum(j["completion_tokens"] for j in done), elapsed, prompt, (slot, ram, disk))
