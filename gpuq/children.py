"""Child processes that cannot outlive the process that started them.

``gpuq up`` starts a private Redis and the supervisor, and the supervisor starts the
workers. If a parent dies without stopping its children (SIGKILL, an OOM kill, a crash),
orphans would keep serving: workers taking jobs nobody watches, a Redis still writing the
append-only file that the next ``gpuq up`` opens again. So on Linux every child asks the
kernel for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``): workers then shut down
warm (their running jobs finish) and Redis flushes and exits. Elsewhere this is a no-op.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

PR_SET_PDEATHSIG = 1


def _die_with_parent_hook() -> Callable[[], None] | None:
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before the fork: the hook only calls it
    parent = os.getpid()

    def hook() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(1)

    return hook


def spawn_child(args: Sequence[str], **popen_options: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(args, ...)`` for a child that gets SIGTERM when this process dies.

    The kernel ties the request to the thread that forks, so spawn children from a thread
    that lives as long as they should (the main thread)."""
    return subprocess.Popen(list(args), preexec_fn=_die_with_parent_hook(), **popen_options)
