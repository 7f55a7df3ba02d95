"""Which llama.cpp passes give a row the same logits whatever else the pass holds.

The engine promises that a seeded or greedy job's text does not depend on what decodes
beside it nor on whether its prompt's start came from the cache. That holds only where a
row's logits do not depend on the pass it was computed in, so this measures it, on the
bundled model, with flash attention off and on (the engine's default):

- **decode row, alone or beside another stream**: a sequence's next token decoded as the
  only row of a pass, and again beside another KV stream's row, with a short context (every
  stream under 512 cells) and a long one;
- **prompt rows, by pass length**: a 128-token prompt fed in passes of 64, 32 and 16 rows,
  then the same two tokens decoded after it;
- **prompt beside decode rows**: a 24-token prompt fed a token a pass beside another
  stream's decode row, against the same prompt in one pass of its own.

A difference of 0 is exact. The CPU figures explain the engine's rules: reuse only rows
computed in passes of two rows or more; with flash attention, no lone decode row over 512
cells and no 64-row prompt pass, since ggml's CPU flash attention takes other kernels for
those two shapes (the KV split over threads, then reduced; tiled), each rounding
differently from the row-by-row kernel; and short prompts beside the decode rows only with
flash attention on, since without it a stream's one row takes other attention kernels than
a pass of its own rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import llama_cpp
import numpy as np

from gpuq.registry.bundled import require_bundled_model_path

STREAM_CELLS = 2048
SHORT, LONG = 100, 700  # prompt lengths: every stream under 512 cells, and over


@dataclass(frozen=True)
class Check:
    flash_attn: bool
    what: str
    max_abs_diff: float


class _Context:
    def __init__(self, model: llama_cpp.llama_model_p, *, flash_attn: bool, threads: int) -> None:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = 2 * STREAM_CELLS, 512, 512
        params.n_seq_max, params.kv_unified = 2, False
        params.n_threads = params.n_threads_batch = threads
        params.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        self.ctx = llama_cpp.llama_init_from_model(model, params)
        self.batch = llama_cpp.llama_batch_init(512, 0, 1)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))

    def decode(self, rows: list[tuple[int, int, int, bool]]) -> None:
        """One pass of (token, position, stream, wants logits) rows."""
        b = self.batch
        b.n_tokens = len(rows)
        for i, (token, pos, stream, logits) in enumerate(rows):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, logits
            b.seq_id[i][0] = stream
        if llama_cpp.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")

    def prefill(self, stream: int, tokens: list[int], *, rows: int = 64) -> None:
        for start in range(0, len(tokens), rows):
            self.decode([(t, start + j, stream, False) for j, t in enumerate(tokens[start : start + rows])])

    def logits(self, row: int) -> np.ndarray:
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.ctx, row), shape=(self.n_vocab,)).copy()

    def close(self) -> None:
        llama_cpp.llama_batch_free(self.batch)
        llama_cpp.llama_free(self.ctx)


def _decode_alone_or_beside(model: llama_cpp.llama_model_p, flash_attn: bool, threads: int, n: int) -> float:
    rng = np.random.default_rng(n)
    own, other = ([int(t) for t in rng.integers(100, 20_000, size=n)] for _ in range(2))
    ctx = _Context(model, flash_attn=flash_attn, threads=threads)
    try:
        ctx.prefill(0, own[:-1])
        ctx.decode([(own[-1], n - 1, 0, True)])
        alone = ctx.logits(0)
        ctx.prefill(1, other[:-1])
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx.ctx), 0, n - 1, -1)
        ctx.decode([(own[-1], n - 1, 0, True), (other[-1], n - 1, 1, True)])
        return float(np.abs(alone - ctx.logits(0)).max())
    finally:
        ctx.close()


def _prompt_by_pass_length(model: llama_cpp.llama_model_p, flash_attn: bool, threads: int) -> dict[int, np.ndarray]:
    tokens = [int(t) for t in np.random.default_rng(1).integers(100, 20_000, size=130)]
    out = {}
    for rows in (64, 32, 16):
        ctx = _Context(model, flash_attn=flash_attn, threads=threads)
        try:
            ctx.prefill(0, tokens[:128], rows=rows)
            ctx.decode([(tokens[128], 128, 0, False), (tokens[129], 129, 0, True)])
            out[rows] = ctx.logits(1)
        finally:
            ctx.close()
    return out


def _prompt_beside_decode_rows(model: llama_cpp.llama_model_p, flash_attn: bool, threads: int) -> float:
    rng = np.random.default_rng(2)
    prompt, other = ([int(t) for t in rng.integers(100, 20_000, size=n)] for n in (24, 41))
    ctx = _Context(model, flash_attn=flash_attn, threads=threads)
    try:
        ctx.decode([(t, p, 1, p == len(prompt) - 1) for p, t in enumerate(prompt)])
        own = ctx.logits(len(prompt) - 1)
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx.ctx), 1, -1, -1)
        ctx.prefill(0, other[:40])
        for p, t in enumerate(prompt):
            ctx.decode([(other[40], 40 + p, 0, True), (t, p, 1, True)])
        return float(np.abs(own - ctx.logits(1)).max())
    finally:
        ctx.close()


def run(*, threads: int, gpu_layers: int = 0) -> list[Check]:
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = gpu_layers
    model = llama_cpp.llama_model_load_from_file(str(require_bundled_model_path()).encode(), params)
    checks = []
    try:
        for flash_attn in (False, True):
            for n in (SHORT, LONG):
                diff = _decode_alone_or_beside(model, flash_attn, threads, n)
                checks.append(Check(flash_attn, f"decode row alone vs beside another stream, {n}-token context", diff))
            by_rows = _prompt_by_pass_length(model, flash_attn, threads)
            for a, b in ((64, 32), (32, 16)):
                diff = float(np.abs(by_rows[a] - by_rows[b]).max())
                checks.append(Check(flash_attn, f"prompt rows in passes of {a} vs {b}", diff))
            diff = _prompt_beside_decode_rows(model, flash_attn, threads)
            checks.append(Check(flash_attn, "prompt a token a pass beside a decode row vs a pass of its own", diff))
    finally:
        llama_cpp.llama_model_free(model)
    return checks
