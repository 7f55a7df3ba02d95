"""llama.cpp's own log, routed through Python logging (the ``llama_cpp`` logger).

llama-cpp-python installs a callback at import that prints each llama.cpp line to stderr
whenever its logger's level is unset or low enough, whatever ``verbose=False`` says; the
decoder, which drives llama.cpp through its low-level classes, never sets that level. So a
worker printed every ``llama_graph_n_input_tensors`` line, context and KV dump (4,590 of
5,185 lines in 15 minutes of ``gpuq up``). ``route_llama_log`` replaces that callback with
one that hands each line to the ``llama_cpp`` logger at its own level; the logging
configuration (``gpuq.log_config``) keeps that logger at WARNING unless ``-v`` is given.
Workers call it before loading a model, the API before loading a tokenizer.

llama.cpp writes a line in pieces (level ``CONT`` continues the last one), so pieces are
joined until a newline and the line is logged at the level of its first piece."""

from __future__ import annotations

import ctypes
import logging
import threading
from typing import Any

log = logging.getLogger("llama_cpp")

# ggml.h's enum ggml_log_level: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (continues the
# last piece). llama-cpp-python's own map is of the older order (INFO 1 ... DEBUG 4): through
# it, context and KV dumps (INFO) pass as warnings.
LEVELS = {0: logging.CRITICAL, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
CONT = 5


class LineJoiner:
    """Pieces of llama.cpp's log joined into lines, each logged once at its first piece's level;
    a line below the logger's level is dropped before its pieces are even decoded."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._lock = threading.Lock()  # llama.cpp may log from more than one thread
        self._pending: list[bytes] = []
        self._level = logging.DEBUG
        self._keep = False

    def piece(self, ggml_level: int, text: bytes) -> None:
        with self._lock:
            if ggml_level != CONT:
                self._flush()
                self._level = LEVELS.get(ggml_level, logging.DEBUG)
                self._keep = self._logger.isEnabledFor(self._level)
            if not self._keep:
                return
            self._pending.append(text)
            if text.endswith(b"\n"):
                self._flush()

    def _flush(self) -> None:
        line = b"".join(self._pending).decode("utf-8", errors="replace").rstrip("\n")
        self._pending = []
        if self._keep and line.strip():
            self._logger.log(self._level, "%s", line)


_joiner = LineJoiner(log)
_callback: Any = None  # kept referenced: llama.cpp holds only a C pointer to it


def route_llama_log() -> None:
    """llama.cpp's log through the ``llama_cpp`` logger from now on (once per process)."""
    global _callback
    if _callback is not None:
        return
    import llama_cpp

    @llama_cpp.llama_log_callback
    def callback(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
        _joiner.piece(level, text)

    _callback = callback
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
