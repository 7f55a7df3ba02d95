"""The llama.cpp context of a decoder: decodes one planned batch, and says what came out.

``BatchRunner.run`` takes a :class:`~worker.decoding.plan.Batch` (rows in stream order and
which sequence each serves), makes it one ``llama_decode``, removes the throwaway rows'
cells once decoded, and returns a :class:`StepOutput`: the batch (so which row is whose),
llama.cpp's code, and the logits rows, valid until the next decode. It changes no
sequence: committing the output is ``commit.py``'s. It also applies ``KvStreams``'s
operations to llama.cpp's memory, and saves and restores streams' cells for the prefix cache
(``kv_state.py``): it is the only code that touches the context.

It remembers the stream copies not yet applied (llama.cpp applies them at the next decode):
a stream such a copy goes into is never saved, and one it comes from or goes into is never
restored into (``kv_state.py`` says why); the save or restore is then skipped, a lost chance,
never a wrong cell.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from worker.decoding import kv_state
from worker.decoding.kv_streams import Copy, KvOp, Trim
from worker.decoding.plan import N_BATCH, Batch

DECODED = 0
NO_KV_ROOM = 1  # llama_decode found no room in the KV cache, and left it as it was


class DecodeError(RuntimeError):
    """llama_decode failed for a reason other than a full KV cache: the context is unusable."""


class Logits(Protocol):
    """A decoded batch's logits rows, by place in the batch (valid until the next decode)."""

    def row(self, place: int) -> np.ndarray:
        """The row in llama.cpp's own buffer: writing it changes what is sampled from it."""

    def sample(self, sampler: Any, place: int) -> int:
        """A token drawn from the row by a sequence's sampler chain (which accepts it)."""


@dataclass(frozen=True, slots=True)
class StepOutput:
    """One planned batch, decoded: the batch (which row is which sequence's), the code
    llama.cpp returned (``DECODED`` or ``NO_KV_ROOM``), and its logits rows."""

    batch: Batch
    code: int
    logits: Logits


class BatchRunner:
    """One llama.cpp context of ``slots`` KV streams over shared weights."""

    def __init__(self, model: Any, *, slots: int, n_ctx_per_seq: int, threads: int, flash_attn: bool) -> None:
        import llama_cpp
        from llama_cpp._internals import LlamaContext

        self._llama = llama_cpp
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx_per_seq * slots
        params.n_batch = params.n_ubatch = N_BATCH
        params.n_seq_max = slots
        params.kv_unified = False  # a KV stream per sequence: outputs do not depend on neighbours
        params.n_threads = params.n_threads_batch = threads
        # On by default, as llama-server has it (Llama has it off): exact on the CPU by two rules
        # (FLASH_ATTN_CHUNK_TOKENS and the throwaway rows of plan.py).
        params.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO if flash_attn else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        params.no_perf = True
        self.slots = slots
        self._ctx = LlamaContext(model=model, params=params, verbose=False)
        self._memory = llama_cpp.llama_get_memory(self._ctx.ctx)
        self._batch = llama_cpp.llama_batch_init(N_BATCH, 0, 1)
        self._n_vocab = model.n_vocab()
        self.tokens_decoded = 0  # every token any llama_decode of this context took: the shares of energy
        self.decode_seconds = 0.0  # inside llama_decode: the rest of a step is the engine's own cost
        self.params = params  # what the context was made with (the prefix cache's key reads it)
        self._copies: set[tuple[int, int]] = set()  # (src, dst) copied since the last decode

    def close(self) -> None:
        if self._batch is not None:
            self._llama.llama_batch_free(self._batch)
            self._batch = None
        self._ctx.close()

    def run(self, batch: Batch) -> StepOutput:
        """One llama_decode of the batch. ``NO_KV_ROOM``: llama.cpp left the cache as it was."""
        b = self._batch
        for i, (token, pos, stream, logits) in enumerate(batch.rows):
            b.token[i] = token
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = stream
            b.logits[i] = logits
        b.n_tokens = len(batch.rows)
        started = time.perf_counter()
        code = int(self._llama.llama_decode(self._ctx.ctx, b))
        self.decode_seconds += time.perf_counter() - started
        self._copies.clear()  # a decode applies the pending copies first, whatever it returns
        if code not in (DECODED, NO_KV_ROOM):
            raise DecodeError(f"llama_decode returned {code}")
        if code == DECODED:
            self.tokens_decoded += batch.counted
            for row in batch.throwaway:
                self._llama.llama_memory_seq_rm(self._memory, row.stream, row.position, -1)
        return StepOutput(batch, code, self)

    def stream_ends(self) -> tuple[int, ...]:
        """Each stream's next free position: its last cell's, plus one (0 when empty)."""
        pos_max = self._llama.llama_memory_seq_pos_max
        return tuple(int(pos_max(self._memory, stream)) + 1 for stream in range(self.slots))

    def apply(self, ops: Iterable[KvOp]) -> None:
        """``KvStreams``'s operations, in order, on llama.cpp's memory."""
        for op in ops:
            if isinstance(op, Copy):
                # Whole streams: llama.cpp copies the buffers at the next decode, in order.
                self._llama.llama_memory_seq_cp(self._memory, op.src, op.dst, -1, -1)
                self._copies.add((op.src, op.dst))
            elif isinstance(op, Trim):
                self._llama.llama_memory_seq_rm(self._memory, op.stream, op.keep, -1)
            else:
                raise TypeError(f"{op} is the decoder's to apply (the prefix cache's)")

    def copy_pending(self, stream: int) -> bool:
        """A copy not yet applied comes from the stream or goes into it."""
        return any(stream in pair for pair in self._copies)

    def save(self, stream: int, *, keep: int) -> bytes | None:
        """The stream's cells at positions ``[0, keep)`` as bytes (the cells after them are
        removed); None when a copy not yet applied goes into the stream."""
        if any(dst == stream for _, dst in self._copies):
            return None
        return kv_state.save_stream(self._ctx.ctx, stream, keep=keep)

    def restore(self, stream: int, data: bytes, *, keep: int) -> bool:
        """``data`` (from :meth:`save`) into a free ``stream``, then cut to ``keep`` positions.
        False, the stream left empty, when llama.cpp refuses the bytes; False, the stream
        untouched, when a copy not yet applied comes from it or goes into it."""
        if self.copy_pending(stream):
            return False
        return kv_state.restore_stream(self._ctx.ctx, stream, data, keep=keep)

    # ------------------------------------------------------------- Logits, of the last decode

    def row(self, place: int) -> np.ndarray:
        logits = self._llama.llama_get_logits_ith(self._ctx.ctx, place)
        return np.ctypeslib.as_array(logits, shape=(self._n_vocab,))

    def sample(self, sampler: Any, place: int) -> int:
        return int(self._llama.llama_sampler_sample(sampler.sampler, self._ctx.ctx, place))
