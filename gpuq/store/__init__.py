"""Every read and write of the SQL tables, as functions that say what they do, one
module per concept. Callers use them as ``store.get_job(session, ...)``.

Functions take a sync ``Session``. The asyncio API calls them through
``AsyncSession.run_sync`` so there is one implementation for every process.
State changes that race (claim, cancel, finish) are conditional UPDATEs: the database,
not timing, decides who wins.
"""

from __future__ import annotations

from gpuq.store.api_keys import (
    create_api_key,
    find_active_key,
    get_api_key,
    has_admin_key,
    known_owners,
    list_api_keys,
    revoke_api_key,
)
from gpuq.store.batches import (
    batch_jobs,
    batch_line_counts,
    batches_with_status,
    cancel_queued_batch_jobs,
    delete_batch,
    get_batch,
    get_file,
    insert_batch,
    list_batches,
    mark_batch_cancel_requested,
    running_batch_jobs,
    save_file,
    set_batch_status,
)
from gpuq.store.fleet import (
    delete_rule,
    get_rule,
    list_gpus,
    list_rules,
    save_rule,
    set_gpu_health,
    upsert_gpus,
)
from gpuq.store.gpu_samples import (
    gpu_samples,
    prune_gpu_samples,
    record_gpu_samples,
)
from gpuq.store.jobs import (
    ClaimedJob,
    JobFilter,
    NewJob,
    Outcome,
    cancel_queued_job,
    claim_job,
    count_jobs_by_status,
    delete_queued_jobs,
    fail_abandoned_job,
    get_job,
    insert_jobs,
    jobs_by_idempotency_keys,
    list_jobs,
    mark_cancel_requested,
    new_job_id,
    queued_jobs_created_before,
    record_outcomes,
    record_outcomes_written,
    return_to_queue,
    running_jobs,
)
from gpuq.store.model_registry import (
    get_model,
    list_models,
    save_model,
)
from gpuq.store.schedules import (
    delete_schedule,
    get_schedule,
    list_schedules,
    save_schedule,
    schedule_runs,
)
from gpuq.store.webhooks import (
    list_deliveries,
)

__all__ = [
    "ClaimedJob",
    "JobFilter",
    "NewJob",
    "Outcome",
    "batch_jobs",
    "batch_line_counts",
    "batches_with_status",
    "cancel_queued_batch_jobs",
    "cancel_queued_job",
    "claim_job",
    "count_jobs_by_status",
    "create_api_key",
    "delete_batch",
    "delete_queued_jobs",
    "delete_rule",
    "delete_schedule",
    "fail_abandoned_job",
    "find_active_key",
    "get_api_key",
    "get_batch",
    "get_file",
    "get_job",
    "get_model",
    "get_rule",
    "get_schedule",
    "gpu_samples",
    "has_admin_key",
    "insert_batch",
    "insert_jobs",
    "jobs_by_idempotency_keys",
    "known_owners",
    "list_api_keys",
    "list_batches",
    "list_deliveries",
    "list_gpus",
    "list_jobs",
    "list_models",
    "list_rules",
    "list_schedules",
    "mark_batch_cancel_requested",
    "mark_cancel_requested",
    "new_job_id",
    "prune_gpu_samples",
    "queued_jobs_created_before",
    "record_gpu_samples",
    "record_outcomes",
    "record_outcomes_written",
    "return_to_queue",
    "revoke_api_key",
    "running_batch_jobs",
    "running_jobs",
    "save_file",
    "save_model",
    "save_rule",
    "save_schedule",
    "schedule_runs",
    "set_batch_status",
    "set_gpu_health",
    "upsert_gpus",
]
