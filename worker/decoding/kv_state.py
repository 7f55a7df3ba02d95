"""One KV stream's cells as bytes, and back: what the prefix cache's tiers keep.

llama.cpp saves a sequence's cells (positions, K and V rows of every layer) with
``llama_state_seq_get_data_ext`` and puts them into any sequence of a context of the same
shape with ``llama_state_seq_set_data_ext`` (flags 0: the whole state, in host memory; it
empties the destination first). The bytes are llama.cpp's own format: they fit only a context
of the same model, KV types, cells per stream and stream count (``n_seq_max``: the format
counts streams), so the cache's key carries all of these (``worker/prefix_cache/key.py``) and a
restore that llama.cpp refuses is a miss, never an error.

Exact: the cells come back bit for bit, at the same positions, so tokens decoded after a
restore see what they would have seen in the stream that computed them
(tests/worker/decoding/test_kv_state.py decodes after a restore into another stream and into
another context and compares the texts and log-probabilities with the stream's own).

**Copies not yet applied.** llama.cpp copies a whole stream (``llama_memory_seq_cp`` across
streams: ``Copy`` in ``kv_streams.py``) at the next ``llama_decode``: the destination's cells
are marked at once, their K and V rows are copied later. Saving and restoring read and write
the rows at once, so, between two decodes (measured, tests/worker/decoding/test_kv_state.py):

- never save a stream that a copy not yet applied goes into (the saved rows are the old ones);
- never restore into a stream that a copy not yet applied comes from (the copy would carry the
  restored rows into its destination).

The engine saves a free stream before ``KvStreams.place`` hands it to a new sequence (a free
stream is never a copy's destination), and restores only into a stream that no copy since the
last decode came from (else into another free stream, or at the next step).

Only a stream's *reusable* cells are worth keeping (``kv_streams.py``: the prompt tokens
computed in whole chunks, or in passes of two rows or more with any common prefix); the cells
after them (a completion's, a prompt's last partial chunk) are removed before saving and again
after a restore, so no unreusable cell is ever taken for a reusable one.
"""

from __future__ import annotations

import ctypes
from typing import Any

FLAGS = 0  # LLAMA_STATE_SEQ_FLAGS_NONE: every part of the state, copied to host memory


def save_stream(ctx: Any, stream: int, *, keep: int) -> bytes:
    """The cells of ``stream`` at positions ``[0, keep)`` as bytes. The stream's cells from
    ``keep`` on are removed first (they are not reusable; call it on a stream being given up or
    kept, never on one whose sequence still decodes). ``ctx``: a ``llama_context_p``."""
    import llama_cpp

    memory = llama_cpp.llama_get_memory(ctx)
    llama_cpp.llama_memory_seq_rm(memory, stream, keep, -1)
    size = int(llama_cpp.llama_state_seq_get_size_ext(ctx, stream, FLAGS))
    buffer = (ctypes.c_uint8 * size)()
    written = int(llama_cpp.llama_state_seq_get_data_ext(ctx, buffer, size, stream, FLAGS))
    if written == 0:
        raise RuntimeError(f"llama.cpp could not save KV stream {stream}")
    return bytes(memoryview(buffer)[:written])


def restore_stream(ctx: Any, stream: int, data: bytes, *, keep: int) -> bool:
    """``data`` (from :func:`save_stream`) into ``stream``, which must hold no live sequence;
    then the cells from ``keep`` on removed (a prefix match shorter than the saved start).
    False, the stream left empty, when llama.cpp refuses the bytes (another context shape)."""
    import llama_cpp

    memory = llama_cpp.llama_get_memory(ctx)
    source = ctypes.cast(ctypes.c_char_p(data), ctypes.POINTER(ctypes.c_uint8))  # no copy: data outlives the call
    read = int(llama_cpp.llama_state_seq_set_data_ext(ctx, source, len(data), stream, FLAGS))
    if read == 0:
        llama_cpp.llama_memory_seq_rm(memory, stream, -1, -1)
        return False
    llama_cpp.llama_memory_seq_rm(memory, stream, keep, -1)
    return True


def stream_length(ctx: Any, stream: int) -> int:
    """How many positions the stream holds, from 0 (its largest position plus one)."""
    import llama_cpp

    return int(llama_cpp.llama_memory_seq_pos_max(llama_cpp.llama_get_memory(ctx), stream)) + 1
