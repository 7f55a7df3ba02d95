"""Pausing Python's cyclic garbage collector around bulk work.

Accepting a 50,000-line batch allocates hundreds of thousands of small objects that all
survive until it ends; every few hundred allocations the collector walks the growing
heap again, which cost about a third of the planning time. Nothing in that work makes
reference cycles worth collecting early, so the collector waits until it is done.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0  # pauses in progress (several API worker threads may pause): the last one out resumes
_resume = False  # whether the collector was on before the first pause


@contextmanager
def gc_paused() -> Iterator[None]:
    global _depth, _resume
    with _lock:
        if _depth == 0:
            _resume = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _resume:
                gc.enable()
