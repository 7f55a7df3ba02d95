"""What a ~450-token start costs: prefilled, or restored from the prefix cache's tiers.

Each side is a generation of one token (the time to the first token) on a context that never
computed the start, the engine's way (K=4, flash attention on, any common prefix reused):

- **prefilled**: the whole prompt decoded (prompt reuse off);
- **from RAM**: the start found in the RAM tier (block-hash lookup), restored into a free stream
  (``llama_state_seq_set_data_ext``), then the prompt's last tokens decoded;
- **from disk**: the same from the disk tier, in a new cache whose RAM is empty: the file read
  and its checksum checked, from the page cache ("warm") and after its pages were dropped
  (``posix_fadvise(DONTNEED)``, "cold": a read from the device).

Rounds interleave the sides; medians. Every side's token is checked to be the prefilled one's.
The restore call alone (llama.cpp copying the bytes into the cells) is reported beside.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from gpuq.jobs.generation_params import GenerationParams
from gpuq.prefix_blocks import cache_scope, model_fingerprint, namespace_salt
from gpuq.registry.bundled import require_bundled_model_path
from worker.decoding import FLASH_ATTN_CHUNK_TOKENS, PREFILL_CHUNK_TOKENS
from worker.decoding.kv_state import restore_stream, save_stream
from worker.engine import LoadedModel
from worker.prefix_cache import CacheKey, KvLayout, PrefixCache

SLOTS = 4
N_CTX = 1024
FEW_SHOT = "".join(f"Q: what is {a} times {b}? A: {a * b}.\n" for a in range(2, 6) for b in range(3, 10))
PROMPT = FEW_SHOT + "Q: what is 7 times 8? A:"
SIDES = ("prefilled", "from RAM", "from disk, warm", "from disk, cold")


@dataclass
class Figures:
    prompt_tokens: int = 0
    restored_tokens: int = 0
    state_bytes: int = 0
    first_token_ms: dict[str, list[float]] = field(default_factory=lambda: {side: [] for side in SIDES})
    restore_ms: dict[str, list[float]] = field(default_factory=lambda: {side: [] for side in SIDES[1:]})
    lookup_ms: dict[str, list[float]] = field(default_factory=lambda: {side: [] for side in SIDES[1:]})


def _model(path: str, threads: int, *, prompt_cache: bool = True, gpu_layers: int = 0) -> LoadedModel:
    """The engine's context: on the CPU any common prefix reused, on a GPU whole chunks."""
    return LoadedModel(
        path,
        n_ctx=N_CTX,
        embedding=False,
        threads=threads,
        gpu_layers=gpu_layers,
        slots=SLOTS,
        prompt_cache=prompt_cache,
    )


def _ctx(model: LoadedModel) -> Any:
    assert model.decoder is not None
    return model.decoder._runner._ctx.ctx  # the decoder's llama_context_p


def _first_token(model: LoadedModel, tokens: list[int]) -> tuple[float, int]:
    """Milliseconds from admission to the first token, and that token."""
    decoder = model.decoder
    assert decoder is not None
    started = time.perf_counter()
    request = {"prompt_token_ids": tokens, "max_tokens": 1, "temperature": 0.0, "stop": []}
    model.prepare("one", GenerationParams.model_validate(request), threading.Event()).admit()
    while True:
        for finished in decoder.step():
            assert finished.generation is not None
            return (time.perf_counter() - started) * 1000, finished.generation.token_ids[0]


def _restored_first_token(
    model: LoadedModel, cache: PrefixCache, key: CacheKey, tokens: list[int]
) -> tuple[float, float, float, int, int]:
    """Lookup, restore into stream 1, the rest prefilled: total ms, lookup ms (a disk tier's
    read and checksum in it), restore-call ms, the first token, and the tokens restored."""
    assert model.decoder is not None
    started = time.perf_counter()
    limit, unit = model.decoder.kv.reuse_bounds(len(tokens))
    found = cache.lookup(key, tokens, limit=limit, unit=unit)
    assert found is not None
    restore_started = time.perf_counter()
    with cache.restoring(found):
        ok = restore_stream(_ctx(model), 1, found.entry.data, keep=found.tokens)
    restore_ms = (time.perf_counter() - restore_started) * 1000
    cache.restored(found, ok=ok)
    assert ok
    model.decoder.kv.restored(1, tokens[: found.tokens], key.namespace)  # the scope prepare gives the job
    rest_ms, token = _first_token(model, tokens)
    lookup_ms = (restore_started - started) * 1000
    return lookup_ms + restore_ms + rest_ms, lookup_ms, restore_ms, token, found.tokens


def _drop_pages(directory: Path) -> None:
    for path in directory.iterdir():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run(*, rounds: int, threads: int, gpu_layers: int = 0) -> Figures:
    """``gpu_layers``: -1 on a GPU (scripts/gpu_check.sh), where reuse is by whole chunks."""
    path = str(require_bundled_model_path())
    figures = Figures()
    prefill = _model(path, threads, prompt_cache=False, gpu_layers=gpu_layers)
    tokens = prefill.prompt_tokens(GenerationParams(prompt=PROMPT))
    figures.prompt_tokens = len(tokens)
    layout = KvLayout(
        type_k=1,
        type_v=1,
        kv_unified=False,
        n_seq_max=SLOTS,
        n_ctx_seq=N_CTX,
        flash_attn=True,
        reuse="any-prefix" if gpu_layers == 0 else "whole-chunks",
        chunk_tokens=FLASH_ATTN_CHUNK_TOKENS if gpu_layers == 0 else PREFILL_CHUNK_TOKENS,
        gpu_layers=gpu_layers,
        llama_version="bench",
    )
    key = CacheKey.of(namespace_salt(model_fingerprint(path), cache_scope(None, shared=False)), layout)
    # The start, computed once the engine's way and saved (what the engine saves on reclaiming a stream).
    source = _model(path, threads, gpu_layers=gpu_layers)
    _ms, expected = _first_token(source, tokens)
    assert source.decoder is not None
    held = source.decoder.kv.holds(0)
    data = save_stream(_ctx(source), 0, keep=len(held))
    source.close()
    figures.state_bytes = len(data)
    with tempfile.TemporaryDirectory(prefix="gpuq-bench-restore-") as directory:
        disk_dir = Path(directory)
        writer = PrefixCache.open(ram_limit_bytes=1 << 30, disk_dir=disk_dir, disk_limit_bytes=1 << 30)
        writer.save(key, held, data)
        writer.close()
        for _ in range(rounds):
            ms, token = _first_token(prefill, tokens)
            assert token == expected
            figures.first_token_ms["prefilled"].append(ms)
            for side in SIDES[1:]:
                if side == "from RAM":
                    cache = writer
                else:
                    cache = PrefixCache.open(ram_limit_bytes=0, disk_dir=disk_dir, disk_limit_bytes=1 << 30)
                    if side.endswith("cold"):
                        _drop_pages(disk_dir)
                model = _model(path, threads, gpu_layers=gpu_layers)
                ms, lookup_ms, restore_ms, token, restored = _restored_first_token(model, cache, key, tokens)
                model.close()
                assert token == expected
                figures.restored_tokens = restored
                figures.first_token_ms[side].append(ms)
                figures.lookup_ms[side].append(lookup_ms)
                figures.restore_ms[side].append(restore_ms)
            print(
                "  round: " + ", ".join(f"{side} {figures.first_token_ms[side][-1]:.1f} ms" for side in SIDES),
                flush=True,
            )
    prefill.close()
    return figures


def report(figures: Figures, *, rounds: int, threads: int) -> str:
    base = median(figures.first_token_ms["prefilled"])
    lines = [
        f"\nrestore: a {figures.prompt_tokens}-token prompt, {figures.restored_tokens} of its tokens from the cache "
        f"({figures.state_bytes / 1e6:.1f} MB of KV state), K={SLOTS}, {threads} threads, "
        f"median of {rounds} rounds (time to the first token)",
    ]
    for side in SIDES:
        runs = figures.first_token_ms[side]
        restore = (
            f"   lookup {median(figures.lookup_ms[side]):6.2f} ms, "
            f"restore call {median(figures.restore_ms[side]):6.2f} ms"
            if side in figures.restore_ms
            else ""
        )
        lines.append(
            f"  {side:<16} {median(runs):8.1f} ms  {median(runs) / base:6.3f}x   "
            f"runs: {', '.join(f'{r:.1f}' for r in runs)}{restore}"
        )
    ram, warm, cold = (median(figures.first_token_ms[s]) / base for s in SIDES[1:])
    lines.append(f"restore: RAM/prefill {ram:.3f}x, disk/prefill {warm:.3f}x warm, {cold:.3f}x cold (target < 0.5x)")
    return "\n".join(lines)
