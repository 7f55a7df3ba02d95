"""The ``gpuq`` command: the root group, with each command group from its own module."""

from __future__ import annotations

import os

import click

from gpuq.cli import batches, db, fleet, job, jobs, models, processes, run
from gpuq.cli.admin import admin
from gpuq.cli.errors import GpuqGroup
from gpuq.cli.keys import keys
from gpuq.cli.rules import rules
from gpuq.cli.schedules import schedules
from gpuq.log_config import configure_logging
from gpuq.settings import get_settings, refuse_unknown_variables


@click.group(cls=GpuqGroup)
@click.option("-v", "--verbose", is_flag=True, help="debug logging, and the traceback of an unexpected error")
@click.option("--url", default=None, help="gpuq API address for client commands (default GPUQ_API_URL)")
def main(verbose: bool, url: str | None) -> None:
    """gpuq: durable priority queues for LLM generation and embedding jobs on GPUs."""
    refuse_unknown_variables(os.environ)  # before any command quietly runs on a default
    settings = get_settings()
    configure_logging(verbose=verbose, job_lines=settings.log_job_lines, level=settings.log_level)


for command in (
    *processes.COMMANDS,
    *fleet.COMMANDS,
    db.db,
    *jobs.COMMANDS,
    *job.COMMANDS,
    run.run,
    models.models,
    batches.batch,
    batches.run_batch_command,
    rules,
    schedules,
    keys,
    admin,
):
    main.add_command(command)

if __name__ == "__main__":
    main()
