"""A job's request, typed: what a generation or an embedding job asks of its worker.

Four producers build these (gpuq's jobs API, the OpenAI routes, the Ollama routes, batch
lines and so schedules' inline lines); the job row stores :meth:`JobParams.stored`, and the
worker reads a claimed row back with ``GenerationParams.model_validate(row.request)``. The
stored keys are the ones rows have always held, so every row written before reads too.

Validation lives here, once for every producer: each float finite (JSON's ``Infinity`` and
``1e400`` parse to infinity, and PostgreSQL's JSON column refuses NaN), each number within
the range its API documents, each integer within what llama.cpp's C ``int`` takes, booleans
refused where a number is meant (pydantic would read ``false`` as 0). A producer turns a
``ValidationError`` into its route's refusal with :func:`refusal`.

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

from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpuq.errors import RequestError
from gpuq.jobs import constraint, tool_calls

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

    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[dict[str, Any]] | None = Field(None, description="an assistant's calls, in OpenAI's shape")
    tool_call_id: str | None = None
    name: str | None = Field(None, description="a tool message's function name")


# Set by gpuq/jobs/submit.py on an admin's job that names a keep_alive: only such a job may
# shorten how long its model stays loaded (or unload it, with 0). Everyone else's keep_alive
# only ever lengthens it, so no tenant's job unloads a model others rely on
# (worker/model_cache.py). Never taken from a request body: no params model declares it.
KEEP_ALIVE_SHORTENS = "keep_alive_shortens"


class JobParams(BaseModel):
    """What every job's request may carry (a noop job's whole request)."""

    # Rows are read back by the worker: a key a newer API added is ignored, not fatal.
    model_config = ConfigDict(extra="ignore")

    keep_alive: KeepAlive | None = None
    webhook_url: str | None = Field(None, description="POSTed a signed event when the job ends")
    events: Literal["tokens", "end"] | None = Field(
        None, description="gpuq.streams: every piece of text (a streamed call), or only the end"
    )

    def stored(self) -> dict[str, Any]:
        """The job row's ``request``: JSON, unset fields left out."""
        return self.model_dump(mode="json", exclude_none=True)


class ResponseFields(BaseModel):
    """What a ``POST /v1/responses`` call says beyond its generation, kept with its job so
    that the job reads back as OpenAI's response object (gpuq/batches/responses_format.py):
    no second store. The worker ignores it."""

    model_config = ConfigDict(extra="ignore")

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


class GenerationParams(JobParams):
    """One generation: a prompt (text, chat messages or token ids) and how to sample its continuation."""

    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    # Not ``prompt_tokens``: that is the job row's count of the prompt's tokens.
    prompt_token_ids: TokenIds | None = Field(None, description="the prompt as token ids, run as given (no BOS added)")
    max_tokens: MaxTokens | None = Field(None, description="None only before a drop-in call fills it from the context")
    temperature: Temperature = 0.8
    top_p: Probability = 0.95
    top_k: TopK = 40
    min_p: Probability = 0.05
    repeat_penalty: RepeatPenalty = 1.0
    frequency_penalty: Penalty = 0.0
    presence_penalty: Penalty = 0.0
    seed: Seed | None = None
    stop: list[Stop] = Field(default_factory=list, max_length=MAX_STOP_SEQUENCES)
    n: Annotated[Int, Field(ge=1, le=MAX_SAMPLES)] = 1
    logprobs: Annotated[Int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = Field(
        None, description="each completion token's log-probability and this many best alternatives (None: none)"
    )
    echo: bool = Field(False, description="with logprobs: the prompt's tokens and their log-probabilities too")
    endpoint: str | None = Field(None, description="a batch line's URL (its output line's shape)")
    json_schema: dict[str, Any] | None = Field(
        None,
        description="structured output: the text is JSON valid against this schema, enforced token by token "
        '(OpenAI\'s json_object mode and Ollama\'s format "json" are {"type": "object"})',
    )
    tools: list[dict[str, Any]] | None = Field(
        None, description="functions the model may call (OpenAI's tools: type function, name, parameters)"
    )
    tool_choice: Literal["auto", "required"] | dict[str, Any] | None = Field(
        None, description='auto (the default), required, or {"type": "function", "function": {"name": ...}}'
    )
    parallel_tool_calls: bool | None = Field(
        None, description="false: at most one tool call, the first, is read from the reply (None: several may be)"
    )
    response: ResponseFields | None = Field(None, description="a POST /v1/responses call's own fields")

    @model_validator(mode="after")
    def _one_prompt(self) -> GenerationParams:
        given = [x is not None for x in (self.prompt, self.messages, self.prompt_token_ids)]
        if sum(given) != 1:
            raise ValueError("give exactly one of `prompt` (text), `messages` (chat) or `prompt_token_ids`")
        if self.prompt is not None and not self.prompt:
            raise ValueError("`prompt` is empty")
        if self.messages is not None and not any(m.content or m.tool_calls for m in self.messages):
            raise ValueError("`messages` are all empty: at least one needs content")
        return self

    @model_validator(mode="after")
    def _enforceable(self) -> GenerationParams:
        """Fail closed: a constraint the engine cannot enforce is refused, never ignored."""
        if self.tools is not None:
            _check_tools(self.tools, self.tool_choice, chat=self.messages is not None)
        elif self.tool_choice is not None:
            raise ValueError("`tool_choice` needs `tools`")
        schema = self.output_schema
        if schema is not None:
            try:
                constraint.check(schema)
            except constraint.UnenforceableSchema as exc:
                raise ValueError(str(exc)) from None
        return self

    @property
    def output_schema(self) -> dict[str, Any] | None:
        """The JSON schema its text must match while sampling: ``json_schema``, or a call of
        one of its tools when ``tool_choice`` requires one; None: unconstrained."""
        if self.json_schema is not None:
            return self.json_schema
        if self.tools:
            return tool_calls.forced_schema(self.tools, self.tool_choice or "auto")
        return None

    @property
    def max_new_tokens(self) -> int:
        """``max_tokens`` of a stored request, where it is always set."""
        if self.max_tokens is None:
            raise ValueError("the request has no max_tokens")
        return self.max_tokens


def _check_tools(tools: list[dict[str, Any]], choice: str | dict[str, Any] | None, *, chat: bool) -> None:
    if not chat:
        raise ValueError("`tools` need `messages`: the chat template renders them")
    for i, tool in enumerate(tools):
        fn = tool.get("function")
        if tool.get("type", "function") != "function" or not isinstance(fn, dict):
            raise ValueError(f'tools[{i}] is not a function tool ({{"type": "function", "function": {{...}}}})')
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ValueError(f"tools[{i}].function.name: a function needs a name")
        if "parameters" in fn and not isinstance(fn["parameters"], dict):
            raise ValueError(f"tools[{i}].function.parameters: a JSON schema is a JSON object")
    if isinstance(choice, dict):
        name = tool_calls.function(choice).get("name")
        if name not in tool_calls.names(tools):
            raise ValueError(f"`tool_choice` names {name!r}, which is not one of `tools`")


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


def generation(status: int = 400, prefix: str = "", **fields: Any) -> GenerationParams:
    """A generation request from a producer's fields, or its route's refusal."""
    try:
        return GenerationParams.model_validate(fields)
    except ValidationError as exc:
        raise refusal(exc, status=status, prefix=prefix) from None


def embedding(status: int = 400, prefix: str = "", **fields: Any) -> EmbeddingParams:
    try:
        return EmbeddingParams.model_validate(fields)
    except ValidationError as exc:
        raise refusal(exc, status=status, prefix=prefix) from None
