"""The function name every gpuq RQ job carries (see ``gpuq.jobs.queues.JOB_FUNC``).

``GpuqWorker.execute_job`` runs gpuq jobs itself, with its loaded models; a plain
``rq worker`` pointed at gpuq's queues would call this instead, and must not
silently drop the job.
"""

from __future__ import annotations

from rq import get_current_job


def run_job() -> None:
    # No arguments: RQ's job id is gpuq's job id, and a pickled call without it stays under
    # Redis's 64-byte listpack limit, which keeps a queued job's hash at a third of the size.
    job = get_current_job()
    job_id = job.id if job is not None else "?"
    raise RuntimeError(f"job {job_id} is a gpuq job: run it with `gpuq worker`, not a plain RQ worker")
