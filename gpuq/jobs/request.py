"""A job's request, typed: what a job asks of its worker, built and validated once where it
is made, stored once, and read back typed without being validated again.

Six producers build requests (gpuq's jobs API, the OpenAI, Ollama, Responses and Anthropic
Messages routes, and batch lines, so schedules' too): a generation's is a
``GenerationParams`` (gpuq/jobs/generation_params.py), an embedding's an
:class:`EmbeddingParams`, a noop's a bare :class:`JobParams`. The object travels as it is in
the job's ``JobSpec`` (gpuq/jobs/submit.py); the job row stores :meth:`JobParams.stored`,
the one place a request becomes JSON, and the worker reads its claimed row back with
:meth:`JobParams.from_stored`, the one place JSON becomes a request again. The stored keys
are the ones rows have always held, so every row written before reads too.

Validation lives here, once for every producer: each float finite (JSON's ``Infinity`` and
``1e400`` parse to infinity, and PostgreSQL's JSON column refuses NaN), each number within
the range its API documents, each integer within what llama.cpp's C ``int`` takes, booleans
refused where a number is meant (pydantic would read ``false`` as 0). A producer turns a
``ValidationError`` into its route's refusal with :func:`refusal`. A stored row is not
validated again when it is read back: its producer did that, and validating twice only
compiled a job's JSON schema twice, and could refuse, after its claim, a job an older API
accepted.

**Defaults.** A field's default is llama.cpp's own (its ``common_params_sampling``, which
``create_completion`` uses): what a row without the key has always got from the worker.
Each API's documented defaults differ, and its users expect them, so each producer passes
its own set: :data:`OPENAI_DEFAULTS` (OpenAI documents temperature 1 and top_p 1, and no
top_k, min_p or repeat penalty: those are off; batch lines too, being OpenAI's Batch API),
:data:`OLLAMA_DEFAULTS` (its api/types.go DefaultOptions: temperature 0.8, top_p 0.9, top_k
40, repeat_penalty 1.1, min_p 0). gpuq's own jobs API takes llama.cpp's, the fields' own:
it is a queue in front of llama.cpp, and its users read llama.cpp's documentation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpuq.errors import RequestError

MAX_CONTEXT_TOKENS = 1 << 20
MAX_EMBED_INPUTS = 2048  # OpenAI's limit on /v1/embeddings; the same on every route
MAX_STOP_SEQUENCES = 4
MAX_KEEP_ALIVE_S = 7 * 24 * 3600.0
MAX_SAMPLES = 128
MAX_TOP_LOGPROBS = 20  # OpenAI's limit on top_logprobs
C_INT_MAX = 2**31 - 1  # llama.cpp takes top_k as a C int

# Booleans are refused (strict), integers taken as floats, non-finite values refused.
Float = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Int = Annotated[int, Field(strict=True)]
Temperature = Annotated[Float, Field(ge=0.0, le=2.0)]
Probability = Annotated[Float, Field(ge=0.0, le=1.0)]
Penalty = Annotated[Float, Field(ge=-2.0, le=2.0)]
RepeatPenalty = Annotated[Float, Field(gt=0.0, le=100.0)]
TopK = Annotated[Int, Field(ge=0, le=C_INT_MAX, description="0: off (every token a candidate)")]
Seed = Annotated[Int, Field(ge=0, le=2**32 - 1)]
MaxTokens = Annotated[Int, Field(ge=1, le=MAX_CONTEXT_TOKENS)]
KeepAlive = Annotated[
    Float,
    Field(
        ge=-1,
        le=MAX_KEEP_ALIVE_S,
        description="seconds the model stays loaded after this job (as Ollama's keep_alive); -1 forever, 0 unload now",
    ),
]
Stop = Annotated[str, Field(min_length=1)]
Text = Annotated[str, Field(min_length=1)]
# A prompt given as token ids, run as given. Whether each id is in the model's vocabulary is
# checked where the model is known (gpuq/jobs/submit.py), naming the index, before any job exists.
TokenIds = Annotated[list[Int], Field(min_length=1, max_length=MAX_CONTEXT_TOKENS)]

OPENAI_DEFAULTS: dict[str, Any] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "repeat_penalty": 1.0,
}
OLLAMA_DEFAULTS: dict[str, Any] = {
    "temperature": 0.8,
    "top_p": 0.9,
    "top_k": 40,
    "min_p": 0.0,
    "repeat_penalty": 1.1,
}


class ChatMessage(BaseModel):
    """One message; an assistant's may carry the tool calls it made, and a ``tool`` message
    is a call's result (``tool_call_id`` names the call). The chat template renders them."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[dict[str, Any]] | None = Field(None, description="an assistant's calls, in OpenAI's shape")
    tool_call_id: str | None = None
    name: str | None = Field(None, description="a tool message's function name")


Stored = TypeVar("Stored", bound=BaseModel)


def trusted(model: type[Stored], stored: Mapping[str, Any]) -> Stored:
    """``model`` from a mapping validated when it was stored, not validated again.

    A row written before a field existed lacks its key and gets the field's default; a row
    from before the typed request may hold a null where the field now has a default (``"n":
    null``, ``"stop": null``), which gets the default too, as the worker always read it; a
    key the model does not declare (one a newer API added) is ignored."""
    fields = {name: value for name, value in stored.items() if name in model.model_fields and value is not None}
    return model.model_construct(**fields)


class JobParams(BaseModel):
    """What every job's request may carry (a noop job's whole request)."""

    # Rows are read back by the worker: a key a newer API added is ignored, not fatal.
    model_config = ConfigDict(extra="ignore", frozen=True)

    keep_alive: KeepAlive | None = None
    webhook_url: str | None = Field(None, description="POSTed a signed event when the job ends")
    events: Literal["tokens", "end"] | None = Field(
        None, description="gpuq.streams: every piece of text (a streamed call), or only the end"
    )
    # True on an admin's job that names a keep_alive (gpuq/jobs/submit.py): only such a job may
    # shorten how long its model stays loaded (or unload it, with 0). Everyone else's keep_alive
    # only ever lengthens it, so no tenant's job unloads a model others rely on
    # (worker/model_cache.py). Never taken from what a producer validates (``_not_given``):
    # submit_jobs sets it, from the caller's key, with ``model_copy``, which does not validate.
    keep_alive_shortens: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _not_given(cls, data: Any) -> Any:
        if isinstance(data, dict) and "keep_alive_shortens" in data:
            return {k: v for k, v in data.items() if k != "keep_alive_shortens"}
        return data

    def stored(self) -> dict[str, Any]:
        """The job row's ``request``: JSON, unset fields left out. The one place a request
        is written (``JobSpec.request``)."""
        return self.model_dump(mode="json", exclude_none=True)

    @classmethod
    def from_stored(cls, stored: Mapping[str, Any]) -> Self:
        """A job row's ``request`` read back as its producer built it, without validating it
        again (:func:`trusted` says how older rows read)."""
        return trusted(cls, stored)


class ResponseFields(BaseModel):
    """What a ``POST /v1/responses`` call says beyond its generation, kept with its job so
    that the job reads back as OpenAI's response object (gpuq/batches/responses_format.py):
    no second store. The worker ignores it."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    instructions: bool = Field(False, description="the first message is the call's `instructions`")
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    store: bool = True
    background: bool = False
    max_output_tokens: int | None = Field(None, description="as asked (max_tokens may be filled from the context)")
    text_format: dict[str, Any] | None = Field(None, description="`text.format` as asked, less its schema")
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    service_tier: str | None = Field(None, description="the tier it ran in, as named back (none when not asked)")
    deleted: bool = Field(False, description="DELETE /v1/responses/{id}: its texts are gone")


class EmbeddingParams(JobParams):
    """Inputs to embed, each a text or token ids (run as given); a batch's grouped lines also
    carry which inputs are whose."""

    input: list[Text | TokenIds] = Field(min_length=1, max_length=MAX_EMBED_INPUTS)
    custom_ids: list[str] | None = Field(None, description="a grouped batch job: each line's custom_id")
    input_counts: list[int] | None = Field(None, description="a grouped batch job: each line's number of texts")
    endpoint: str | None = None

    @model_validator(mode="after")
    def _counts_match(self) -> EmbeddingParams:
        if self.input_counts is not None and sum(self.input_counts) != len(self.input):
            raise ValueError("`input_counts` does not add up to the number of texts")
        return self


def openai_items(given: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    """OpenAI's ``prompt`` or ``input`` as the items it holds: a text, or one flat list of token
    ids, is one item; a list of texts or of id lists is one item each."""
    if isinstance(given, str) or (given and all(isinstance(x, int) for x in given)):
        return [cast(str | list[int], given)]
    return list(cast(list[str] | list[list[int]], given))


def refusal(exc: ValidationError, *, status: int = 400, prefix: str = "") -> RequestError:
    """A producer's answer to a request that fails validation: the first error, naming its field."""
    first = exc.errors()[0]
    loc = ".".join(str(part) for part in first["loc"])
    where = prefix + loc if loc else prefix.rstrip(".")
    message = first["msg"].removeprefix("Value error, ")
    return RequestError(status, f"{where}: {message}" if where else message, param=where or None, code="invalid_value")


def embedding(status: int = 400, prefix: str = "", **fields: Any) -> EmbeddingParams:
    try:
        return EmbeddingParams.model_validate(fields)
    except ValidationError as exc:
        raise refusal(exc, status=status, prefix=prefix) from None
