"""How gpuq's processes log: one format, and the loggers that would bury a terminal kept quiet.

`gpuq up` runs in someone's terminal with its workers, so what they print by default is what
an admin needs to read: warnings and errors, start-up and state changes. Quiet unless ``-v``:
llama.cpp's own log (``gpuq.llama_log`` routes it to the ``llama_cpp`` logger), RQ's start-up
and registry-cleaning lines, httpx's request lines, alembic's plugin lines. A line per job
(which queue, which job) is off unless ``GPUQ_LOG_JOB_LINES`` asks for it."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
QUIET_UNLESS_VERBOSE = (
    "llama_cpp",
    "rq.worker",  # "started with PID", "subscribing to channel", "cleaning registries" at each start
    "rq.job",
    "httpx",
    "alembic.runtime.plugins",  # a line per plugin at each start
)
LEVEL_VARIABLE = "GPUQ_LOG_LEVEL"
# A line per job a worker takes ("queue: job id") or starts in a run ("... (n running)").
JOB_LINE_LOGGERS = ("worker.batching", "worker.worker.jobs")


def configure_logging(*, verbose: bool, job_lines: bool, level: str = "INFO") -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else level, format=FORMAT)
    if verbose:
        return
    for name in QUIET_UNLESS_VERBOSE:
        logging.getLogger(name).setLevel(logging.WARNING)
    for name in JOB_LINE_LOGGERS:  # set both ways: a process (or a test) may configure twice
        logging.getLogger(name).setLevel(logging.NOTSET if job_lines else logging.WARNING)


@contextmanager
def only_warnings() -> Iterator[None]:
    """Warnings and errors only, here and in the processes started meanwhile (which read
    GPUQ_LOG_LEVEL): for commands whose own output is the point (`gpuq demo`, `gpuq run-batch`),
    so no worker's start-up line lands among the answers or across a progress bar."""
    root = logging.getLogger()
    was_level, was_env = root.level, os.environ.get(LEVEL_VARIABLE)
    root.setLevel(max(root.level, logging.WARNING))
    os.environ[LEVEL_VARIABLE] = "WARNING"
    try:
        yield
    finally:
        root.setLevel(was_level)
        if was_env is None:
            os.environ.pop(LEVEL_VARIABLE, None)
        else:
            os.environ[LEVEL_VARIABLE] = was_env
