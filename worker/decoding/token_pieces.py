"""A token's bytes as the vocabulary has them, asked from the engine's thread and the desk's.

The engine appends each sampled token's bytes to its sequence's text; the desk asks tokens'
bytes for the log-probabilities it publishes and stores. llama-cpp-python's ctypes calls
release the GIL, so a buffer shared by the two threads could be overwritten by one thread's
``llama_token_to_piece`` between the other's call and its read of the bytes: the other
token's bytes in a job's text or its log-probabilities (tests/worker/test_decoder.py hammers
both threads). Here each token's bytes are made once, into a buffer of that call's own, and
kept: they never change, and a token's bytes are then a dictionary read for both threads.
"""

from __future__ import annotations

import ctypes
from typing import Any

FIRST_BUFFER_BYTES = 64  # longer pieces (rare) are made again in a buffer of the size llama.cpp asks


class TokenPieces:
    """``pieces(token)``: the token's bytes (a special token's text is not rendered: b"")."""

    def __init__(self, vocab: Any) -> None:
        import llama_cpp

        self._to_piece = llama_cpp.llama_token_to_piece
        self._vocab = vocab  # llama.cpp's llama_vocab pointer: only read
        self._pieces: dict[int, bytes] = {}  # a token's bytes, once made (one dict item per token: atomic)

    def __call__(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self._make(token)
        return piece

    def _make(self, token: int) -> bytes:
        size = FIRST_BUFFER_BYTES
        while True:
            buffer = ctypes.create_string_buffer(size)  # this call's own
            n = int(self._to_piece(self._vocab, token, buffer, size, 0, False))
            if n >= 0:
                return buffer.raw[:n]
            size = -n  # llama.cpp answers a buffer too small with minus the size it needs
