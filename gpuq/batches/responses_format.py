"""OpenAI's Responses API as gpuq jobs: a ``POST /v1/responses`` body into a job's request,
and a job back into OpenAI's response object.

A response is a job: its id is the job's (``resp_`` for ``job_``), and everything the
response object says beyond the generation (instructions, metadata, ``store``, the text
format and tool choice as asked) is kept in the job's request (``response``,
gpuq/jobs/request.py). The parts that chat completions has too are chat's:
``tool_choice`` and the forced call (``tool_fields``), the calls read from a reply
(``tool_calls.parse``), the JSON schema's check (``constraint.enforceable``).

What gpuq cannot do is a 400 naming the parameter (built-in tools, reasoning effort, images
and files, ``truncation: auto``, prompt templates, conversations); what changes nothing here
is accepted and ignored (``user``, ``service_tier``, ``safety_identifier``,
``prompt_cache_key``, ``prompt_cache_retention``, ``max_tool_calls``: gpuq has no built-in
tools to call, ``stream_options``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpuq.batches.openai_choices import token_logprob
from gpuq.batches.openai_tools import openai_calls, tool_fields
from gpuq.batches.response_items import call_names, function_call_item, message_item, messages_of, unsupported
from gpuq.db.tables import Job, JobStatus
from gpuq.errors import RequestError
from gpuq.jobs import tool_calls
from gpuq.jobs.constraint import ANY_OBJECT, enforceable
from gpuq.jobs.generation_params import GenerationParams, generation
from gpuq.jobs.request import OPENAI_DEFAULTS, ResponseFields

RESPONSES = "/v1/responses"
RESPONSE_PREFIX = "resp_"
JOB_PREFIX = "job_"
LOGPROBS = "message.output_text.logprobs"  # the one `include` gpuq has
IGNORED = frozenset({"user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention", "max_tool_calls"})
MAX_METADATA_PAIRS = 16

Number = Annotated[float, Field(strict=True)]
Integer = Annotated[int, Field(strict=True)]


def response_id(job_id: str) -> str:
    return RESPONSE_PREFIX + job_id.removeprefix(JOB_PREFIX)


def job_id_of(response_id: str) -> str:
    """The job behind a response id (a job id is taken as itself)."""
    if response_id.startswith(RESPONSE_PREFIX):
        return JOB_PREFIX + response_id.removeprefix(RESPONSE_PREFIX)
    return response_id


class ResponseCreate(BaseModel):
    """``POST /v1/responses``."""

    # Unknown fields are kept to be named in the route's 400 (batch lines ignore them).
    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=128)
    input: str | list[dict[str, Any]] = Field(
        description="a text, or items: messages, function_call and function_call_output"
    )
    instructions: str | None = Field(None, description="a system message before the input (not carried over)")
    previous_response_id: str | None = Field(None, description="continue that stored response's conversation")
    max_output_tokens: Integer | None = Field(None, description="default: what the context leaves after the prompt")
    temperature: Number | None = Field(None, description="0 to 2; default 1")
    top_p: Number | None = Field(None, description="0 to 1; default 1")
    text: dict[str, Any] | None = Field(
        None, description='{"format": {"type": "text" | "json_object" | "json_schema"}}'
    )
    tools: list[dict[str, Any]] | None = Field(None, description='function tools: {"type": "function", "name", ...}')
    tool_choice: str | dict[str, Any] | None = Field(
        None, description='none, auto (default), required or {"type": "function", "name": ...}'
    )
    parallel_tool_calls: bool | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = Field(None, description="default true: the response may be read and continued")
    background: bool | None = Field(None, description="answer at once (queued); read it with GET /v1/responses/{id}")
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    top_logprobs: Integer | None = Field(None, description=f"0 to 20, with include {LOGPROBS!r}")
    prompt: dict[str, Any] | None = None
    conversation: str | dict[str, Any] | None = None
    seed: Integer | None = Field(None, description="gpuq extension, as chat completions' seed")
    top_k: Integer | None = Field(None, description="gpuq extension (llama.cpp's sampler); default 0, off")
    min_p: Number | None = Field(None, description="gpuq extension (llama.cpp's sampler); default 0, off")
    repeat_penalty: Number | None = Field(None, description="gpuq extension (llama.cpp's sampler); default 1, off")
    keep_alive: Number | None = Field(None, description="gpuq extension: seconds the model stays loaded afterwards")
    service_tier: Literal["auto", "default", "flex", "priority"] | None = Field(
        None,
        description="flex runs at low priority, priority at high, auto and default at the key's (and are answered "
        "as default); echoed in the response (a batch line runs at its batch's priority, and echoes none)",
    )

    def refuse_unknown(self) -> None:
        unknown = sorted(set(self.model_extra or {}) - IGNORED)
        if unknown:
            raise RequestError(
                400, f"unrecognized request argument supplied: {unknown[0]}", param=unknown[0], code="unknown_parameter"
            )

    @property
    def stored(self) -> bool:
        return self.store is not False

    def check(self) -> None:
        """A 400 naming the first thing gpuq cannot do (before any lookup or tokenising)."""
        refused = (
            (self.prompt is not None, "prompt", "stored prompt templates: send the input"),
            (
                self.conversation is not None,
                "conversation",
                "the Conversations API: continue with previous_response_id",
            ),
            (self.truncation == "auto", "truncation", "'auto' (earlier turns are never dropped): send 'disabled'"),
            (
                (self.text or {}).get("verbosity") not in (None, "medium"),
                "text.verbosity",
                "the model's answers cannot be made shorter or longer on request",
            ),
            (
                bool(self.reasoning) and any(v is not None for v in (self.reasoning or {}).values()),
                "reasoning",
                "gpuq's models do not reason before answering",
            ),
        )
        for hit, param, why in refused:
            if hit:
                raise unsupported(param, why)
        if self.background and not self.stored:
            raise RequestError(400, "background responses must be stored: leave store true", param="store")
        for i, wanted in enumerate(self.include or ()):
            if wanted != LOGPROBS:
                raise unsupported(f"include[{i}]", f"{wanted!r} (only {LOGPROBS!r})")
        if self.top_logprobs is not None and LOGPROBS not in (self.include or ()):
            raise RequestError(400, f"top_logprobs needs include: [{LOGPROBS!r}]", param="top_logprobs")
        if self.metadata is not None:
            _check_metadata(self.metadata)

    def params(self, history: list[dict[str, Any]], *, service_tier: str | None = None) -> GenerationParams:
        """The job's request: ``history`` (the previous response's conversation, if any)
        after the instructions, then the input; a 400 naming the first parameter gpuq
        cannot honour. ``service_tier``: the tier the response answers it ran in."""
        self.check()
        instructions = [{"role": "system", "content": self.instructions}] if self.instructions else []
        messages = [*instructions, *history, *messages_of(self.input, calls_before=call_names(history))]
        schema, shown_format = _text_format(self.text)
        fields = ResponseFields(
            instructions=bool(instructions),
            previous_response_id=self.previous_response_id,
            metadata=self.metadata,
            store=self.stored,
            background=bool(self.background),
            max_output_tokens=self.max_output_tokens,
            text_format=shown_format,
            tool_choice=self.tool_choice,
            parallel_tool_calls=self.parallel_tool_calls is not False,
            service_tier=service_tier,
        )
        given = {
            "max_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repeat_penalty": self.repeat_penalty,
            "keep_alive": self.keep_alive,
            "logprobs": (self.top_logprobs or 0) if LOGPROBS in (self.include or ()) else None,
        }
        chosen = OPENAI_DEFAULTS | {k: v for k, v in given.items() if v is not None}
        tools = tool_fields(_chat_tools(self.tools), self.tool_choice, parallel=self.parallel_tool_calls is not False)
        return generation(**chosen, messages=messages, json_schema=schema, response=fields, **tools)


def _check_metadata(metadata: dict[str, str]) -> None:
    if len(metadata) > MAX_METADATA_PAIRS:
        raise RequestError(400, f"metadata: at most {MAX_METADATA_PAIRS} pairs", param="metadata")
    for key, value in metadata.items():
        if len(key) > 64 or len(value) > 512:
            raise RequestError(400, "metadata: keys of at most 64 characters, values of at most 512", param="metadata")


def _text_format(text: dict[str, Any] | None) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the JSON schema the answer must match, or None; the format as the response shows it,
    less its schema)."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None, None
    if not isinstance(fmt, dict):
        raise RequestError(400, "text.format must be an object", param="text.format")
    kind = fmt.get("type")
    if kind == "text":
        return None, None
    if kind == "json_object":
        return dict(ANY_OBJECT), {"type": "json_object"}
    if kind == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise RequestError(
                400, "text.format.schema: give the JSON schema the answer must match", param="text.format.schema"
            )
        shown = {k: v for k, v in fmt.items() if k != "schema"}
        return enforceable(schema, "text.format.schema"), shown
    raise RequestError(400, f"text.format.type {kind!r}: text, json_object or json_schema", param="text.format.type")


def _chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The Responses API's flat function tools in chat's shape (``{"type": "function",
    "function": {...}}``), which the chat template renders; built-in tools are refused."""
    if not tools:
        return None
    shaped = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise unsupported(
                f"tools[{i}]", f"tools of type {kind!r} (function tools only: gpuq has no built-in tools)"
            )
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise RequestError(400, f"tools[{i}].name: a function needs a name", param=f"tools[{i}].name")
        if tool.get("parameters") is not None and not isinstance(tool["parameters"], dict):
            raise RequestError(
                400, f"tools[{i}].parameters: a JSON schema is a JSON object", param=f"tools[{i}].parameters"
            )
        function = {k: v for k, v in tool.items() if k != "type" and v is not None}
        shaped.append({"type": "function", "function": function})
    return shaped


def flat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [{"type": "function", **tool_calls.function(tool)} for tool in tools or ()]


# ---------------------------------------------------------------- the response object


@dataclass(frozen=True, slots=True)
class Outcome:
    """Where a response stands: a job's status and, once it ended, its text and figures."""

    status: str  # the job's
    text: str = ""
    finish_reason: str | None = None
    logprobs: list[dict[str, Any]] | None = None
    error: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    finished_at: datetime | None = None


def outcome_of(job: Job) -> Outcome:
    result = job.result or {}
    return Outcome(
        status=job.status,
        text=str(result.get("text", "")),
        finish_reason=result.get("finish_reason"),
        logprobs=result.get("logprobs"),
        error=job.error,
        prompt_tokens=job.prompt_tokens,
        completion_tokens=job.completion_tokens,
        cached_tokens=job.cached_tokens,
        finished_at=job.finished_at,
    )


def status_of(outcome: Outcome) -> str:
    """The response's status: ``incomplete`` when the answer ran out of ``max_output_tokens``."""
    if outcome.status == JobStatus.SUCCEEDED:
        return "incomplete" if outcome.finish_reason == "length" else "completed"
    return {JobStatus.QUEUED: "queued", JobStatus.RUNNING: "in_progress"}.get(JobStatus(outcome.status), outcome.status)


def fields_of(job: Job) -> ResponseFields:
    return ResponseFields.model_validate((job.request or {}).get("response") or {})


def message_id(job_id: str) -> str:
    return "msg_" + job_id.removeprefix(JOB_PREFIX)


def output_items(job: Job, outcome: Outcome) -> list[dict[str, Any]]:
    """The response's output: the answer as one message, or, when the request offered tools
    and the reply is calls, its text (if any) then a ``function_call`` item per call."""
    if outcome.status in (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.FAILED):
        return []
    status = (
        "completed" if outcome.status == JobStatus.SUCCEEDED and outcome.finish_reason != "length" else "incomplete"
    )
    tools = (job.request or {}).get("tools")
    if tools and outcome.status == JobStatus.SUCCEEDED:
        content, calls = tool_calls.parse(outcome.text, tools, parallel=tool_calls.parallel(job.request))
        if calls:
            items = [message_item(message_id(job.id), "assistant", content, status=status)] if content else []
            suffix = job.id.removeprefix(JOB_PREFIX)
            return items + [
                function_call_item(f"fc_{suffix}_{i}", call, status=status)
                for i, call in enumerate(openai_calls(job.id, calls))
            ]
    if outcome.status == JobStatus.CANCELLED and not outcome.text:
        return []
    item = message_item(message_id(job.id), "assistant", outcome.text, status=status)
    if outcome.logprobs is not None:
        item["content"][0]["logprobs"] = [token_logprob(e) for e in outcome.logprobs]
    return [item]


def usage(outcome: Outcome) -> dict[str, Any] | None:
    """None until the response ends (a queued job's row has its prompt's count already)."""
    if outcome.status in (JobStatus.QUEUED, JobStatus.RUNNING) or outcome.prompt_tokens is None:
        return None
    prompt, completion = outcome.prompt_tokens or 0, outcome.completion_tokens or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": outcome.cached_tokens or 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def _seconds(moment: datetime | None) -> int | None:
    return int(moment.timestamp()) if moment is not None else None


def response_object(job: Job, outcome: Outcome | None = None) -> dict[str, Any]:
    """OpenAI's response object for ``job``, as it stands (its row's, unless ``outcome`` says
    more recent news: a stream's end)."""
    outcome = outcome or outcome_of(job)
    request = job.request or {}
    fields = fields_of(job)
    status = status_of(outcome)
    messages = request.get("messages") or []
    text_format = dict(fields.text_format or {"type": "text"})
    if text_format.get("type") == "json_schema":
        text_format["schema"] = request.get("json_schema")
    failed = status == "failed"
    return {
        "id": response_id(job.id),
        "object": "response",
        "created_at": _seconds(job.created_at),
        "status": status,
        "background": fields.background,
        "completed_at": _seconds(outcome.finished_at) if status == "completed" else None,
        "error": {"code": "server_error", "message": outcome.error or "the job failed"} if failed else None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": messages[0].get("content") if fields.instructions and messages else None,
        "max_output_tokens": fields.max_output_tokens,
        "metadata": fields.metadata or {},
        "model": job.model,
        "output": output_items(job, outcome),
        "parallel_tool_calls": fields.parallel_tool_calls,
        "previous_response_id": fields.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "service_tier": fields.service_tier,
        "store": fields.store,
        "temperature": request.get("temperature"),
        "text": {"format": text_format},
        "tool_choice": fields.tool_choice or "auto",
        "tools": flat_tools(request.get("tools")),
        "top_p": request.get("top_p"),
        "truncation": "disabled",
        "usage": usage(outcome),
        "user": None,
    }


def conversation(job: Job) -> list[dict[str, Any]]:
    """A finished response's turns, as a later response continues them: its messages (less
    its instructions, which are not carried over) and its answer (text and calls)."""
    fields = fields_of(job)
    messages = list((job.request or {}).get("messages") or [])
    if fields.instructions:
        messages = messages[1:]
    outcome = outcome_of(job)
    answer: dict[str, Any] = {"role": "assistant", "content": outcome.text}
    tools = (job.request or {}).get("tools")
    if tools:
        content, calls = tool_calls.parse(outcome.text, tools, parallel=tool_calls.parallel(job.request))
        if calls:
            answer = {"role": "assistant", "content": content or "", "tool_calls": openai_calls(job.id, calls)}
    return [*messages, answer]
