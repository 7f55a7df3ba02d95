"""The function name every gpuq RQ job carries (see ``gpuq.jobs.queues.JOB_FUNC``).

``GpuqWorker.execute_job`` runs gpuq jobs itself, with its loaded models; a plain
``rq worker`` pointed at gpuq's queues would call this instead, and must not
silently drop the job.
"""

from __future__ import annotations


def run_job(job_id: str) -> None:
    raise RuntimeError(f"job {job_id} is a gpuq job: run it with `gpuq worker`, not a plain RQ worker")
