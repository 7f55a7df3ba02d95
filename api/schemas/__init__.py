"""Request and response shapes of the HTTP API, one module per concept. Tables live in
``gpuq/models.py``."""

from api.schemas.batches import BatchCreate, BatchesPublic, BatchObject, BatchProgress, FileObject, RequestCounts
from api.schemas.common import MAX_CONTEXT_TOKENS, MAX_EMBED_INPUTS, MAX_STOP_SEQUENCES, ErrorBody, Strict
from api.schemas.fleet import (
    GpuPublic,
    GpusPublic,
    PlacementPreview,
    PreviewGpu,
    RuleCreate,
    RulePublic,
    RuleSaved,
    RulesPublic,
)
from api.schemas.jobs import (
    ChatMessage,
    EmbedJobCreate,
    GenerateJobCreate,
    JobBase,
    JobCreate,
    JobPublic,
    JobsAccepted,
    JobsCreate,
    JobsPublic,
    JobSummary,
    NoopJobCreate,
)
from api.schemas.keys import KeyCreate, KeyCreated, KeyPublic, KeysPublic
from api.schemas.models import ModelCreate, ModelPublic, ModelsPublic
from api.schemas.schedules import (
    FireTimes,
    ScheduleCreate,
    SchedulePatch,
    SchedulePublic,
    ScheduleRunPublic,
    ScheduleRunsPublic,
    SchedulesPublic,
)
from api.schemas.webhooks import DeliveriesPublic, DeliveryPublic

__all__ = [
    "MAX_CONTEXT_TOKENS",
    "MAX_EMBED_INPUTS",
    "MAX_STOP_SEQUENCES",
    "BatchCreate",
    "BatchObject",
    "BatchProgress",
    "BatchesPublic",
    "ChatMessage",
    "DeliveriesPublic",
    "DeliveryPublic",
    "EmbedJobCreate",
    "ErrorBody",
    "FileObject",
    "FireTimes",
    "GenerateJobCreate",
    "GpuPublic",
    "GpusPublic",
    "JobBase",
    "JobCreate",
    "JobPublic",
    "JobSummary",
    "JobsAccepted",
    "JobsCreate",
    "JobsPublic",
    "KeyCreate",
    "KeyCreated",
    "KeyPublic",
    "KeysPublic",
    "ModelCreate",
    "ModelPublic",
    "ModelsPublic",
    "NoopJobCreate",
    "PlacementPreview",
    "PreviewGpu",
    "RequestCounts",
    "RuleCreate",
    "RulePublic",
    "RuleSaved",
    "RulesPublic",
    "ScheduleCreate",
    "SchedulePatch",
    "SchedulePublic",
    "ScheduleRunPublic",
    "ScheduleRunsPublic",
    "SchedulesPublic",
    "Strict",
]
