"""What a process logs: a line per job only when asked (GPUQ_LOG_JOB_LINES), the rest as set."""

import logging

import pytest

from gpuq.log_config import JOB_LINE_LOGGERS, configure_logging


@pytest.fixture
def fresh_loggers():
    names = [*JOB_LINE_LOGGERS, "worker.worker", ""]
    before = {name: logging.getLogger(name).level for name in names}
    logging.getLogger().setLevel(logging.INFO)  # pytest's handlers make basicConfig leave the root as it is
    yield
    for name, level in before.items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.parametrize("job_lines", [False, True])
def test_a_line_per_job_taken_only_when_asked_and_the_workers_other_lines_always(fresh_loggers, job_lines):
    configure_logging(verbose=False, job_lines=job_lines, level="INFO")
    taken = logging.getLogger("worker.worker.jobs")  # worker/worker.py's "queue: job id" as it takes a job
    assert taken.isEnabledFor(logging.INFO) is job_lines
    assert logging.getLogger("worker.worker").isEnabledFor(logging.INFO)  # its state changes stay
    assert taken.isEnabledFor(logging.WARNING)
