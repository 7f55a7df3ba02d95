"""A batch's ``completion_window``: whole hours, from 1h to 168h (a week).

OpenAI's API takes only ``24h``; gpuq takes any of these, and a batch's lines are needed by
its end (their deadline). Its own module, free of the batch engine's imports, so that the
CLI checks ``--completion-window`` by the API's rule before it uploads anything.
"""

from __future__ import annotations

import re

_WINDOW = re.compile(r"^(\d+)h$")
MIN_HOURS, MAX_HOURS = 1, 168
ACCEPTED = f"use hours from {MIN_HOURS}h to {MAX_HOURS}h, e.g. 24h"


def window_seconds(window: str) -> int:
    """The window's length; ValueError, in words for the user, for anything else."""
    match = _WINDOW.match(window)
    hours = int(match.group(1)) if match else 0
    if not MIN_HOURS <= hours <= MAX_HOURS:
        raise ValueError(f"{window!r} is not supported; {ACCEPTED}")
    return hours * 3600
