"""OpenAI's wire formats for batch lines: request bodies in, response bodies out.

Bodies map onto gpuq job requests (generation with ``prompt`` or ``messages``, embedding
with ``input``); results map back onto ``chat.completion``, ``text_completion`` and
embedding ``list`` objects (and Responses API lines, ``/v1/responses``, onto response objects:
gpuq/batches/responses_format.py), so the output file reads as OpenAI's would. The OpenAI routes
(api/schemas/openai.py, gpuq/dropin/openai.py) share the parts that are the same there:
``response_format``, ``tools`` and ``tool_choice`` in, ``message.tool_calls`` out.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuq.batches.openai_choices import choices
from gpuq.batches.openai_tools import openai_calls, tool_fields
from gpuq.batches.responses_format import RESPONSES, ResponseCreate, response_object
from gpuq.db.tables import Job, JobKind
from gpuq.errors import RequestError
from gpuq.jobs import tool_calls
from gpuq.jobs.constraint import ANY_OBJECT, enforceable
from gpuq.jobs.generation_params import GenerationParams
from gpuq.jobs.request import OPENAI_DEFAULTS, EmbeddingParams, JobParams, openai_items, refusal

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
ENDPOINTS = {
    CHAT: JobKind.GENERATE,
    COMPLETIONS: JobKind.GENERATE,
    EMBEDDINGS: JobKind.EMBED,
    RESPONSES: JobKind.GENERATE,
}
MAX_TOKENS_DEFAULT = 256


class _Body(BaseModel):
    # OpenAI clients send fields gpuq has no use for (user, logprobs=false, ...): ignore them.
    model_config = ConfigDict(extra="ignore")
    model: str = Field(min_length=1, max_length=128)


Number = Annotated[float, Field(strict=True)]
Integer = Annotated[int, Field(strict=True)]


class _Sampling(_Body):
    """The sampling fields a line may set; their ranges are the job request's own
    (gpuq/jobs/request.py), OpenAI's defaults where a field is not given."""

    max_tokens: Integer | None = None
    max_completion_tokens: Integer | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    seed: Integer | None = None
    stop: str | list[str] | None = None
    frequency_penalty: Number | None = None
    presence_penalty: Number | None = None
    n: Integer | None = None

    def params(self, **prompt: Any) -> GenerationParams:
        given = {
            "n": self.n,
            "max_tokens": next(
                (n for n in (self.max_completion_tokens, self.max_tokens) if n is not None), MAX_TOKENS_DEFAULT
            ),
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "stop": [self.stop] if isinstance(self.stop, str) else self.stop,
            "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty,
        }
        return GenerationParams.model_validate(
            OPENAI_DEFAULTS | {k: v for k, v in given.items() if v is not None} | prompt
        )


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class ChatBody(_Sampling):
    messages: list[_Message] = Field(min_length=1)
    logprobs: bool | None = None
    top_logprobs: Integer | None = None
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None

    def request(self) -> JobParams:
        messages = [
            chat_message(m.role, m.content or "", tool_calls=m.tool_calls, tool_call_id=m.tool_call_id, index=i)
            for i, m in enumerate(self.messages)
        ]
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("body.top_logprobs needs body.logprobs: true")
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        schema = output_schema(self.response_format)
        tools = tool_fields(self.tools, self.tool_choice, parallel=self.parallel_tool_calls is not False)
        return self.params(messages=messages, json_schema=schema, logprobs=logprobs, **tools)


def chat_message(
    role: str, content: str, *, tool_calls: Any = None, tool_call_id: Any = None, index: int
) -> dict[str, Any]:
    """An OpenAI chat message as a job's request stores it: ``developer`` is the template's
    ``system``; an assistant's earlier calls and a tool's result kept for the template."""
    message: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": content}
    if role == "tool":
        if not isinstance(tool_call_id, str) or not tool_call_id:
            raise RequestError(
                400, f"messages[{index}].tool_call_id: a tool message names the call it answers",
                param=f"messages[{index}].tool_call_id",
            )  # fmt: skip
        message["tool_call_id"] = tool_call_id
    if tool_calls:
        if role != "assistant":
            raise RequestError(400, f"messages[{index}].tool_calls: only assistant messages carry tool calls")
        for j, call in enumerate(tool_calls):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise RequestError(
                    400, f"messages[{index}].tool_calls[{j}]: a call is {{\"type\": \"function\", \"function\": "
                    '{"name": ..., "arguments": ...}}', param=f"messages[{index}].tool_calls",
                )  # fmt: skip
        message["tool_calls"] = tool_calls
    return message


def output_schema(response_format: Any) -> dict[str, Any] | None:
    """OpenAI's ``response_format`` as the JSON schema the answer must match (None: plain
    text); a 400 naming what is wrong, or the keyword the engine cannot enforce."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise RequestError(400, "response_format must be an object", param="response_format")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":  # any object; llama.cpp's server also takes a schema here
        return enforceable(response_format.get("schema", ANY_OBJECT), "response_format.schema")
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise RequestError(
                400,
                "response_format.json_schema.schema: give the JSON schema the answer must match",
                param="response_format.json_schema.schema",
            )
        return enforceable(spec["schema"], "response_format.json_schema.schema")
    raise RequestError(
        400, f"response_format.type {kind!r}: text, json_object or json_schema", param="response_format.type"
    )


def chat_choice(job: Job, text: str, finish: str) -> tuple[dict[str, Any], str]:
    """The assistant message of a chat answer, and its finish reason: with tools offered, the
    calls read from its text (``tool_calls``, finish reason ``tool_calls``)."""
    tools = (job.request or {}).get("tools")
    if tools:
        content, calls = tool_calls.parse(text, tools, parallel=tool_calls.parallel(job.request))
        if calls:
            message = {"role": "assistant", "content": content, "tool_calls": openai_calls(job.id, calls)}
            return message, "tool_calls"
    return {"role": "assistant", "content": text}, finish


class CompletionBody(_Sampling):
    # One prompt a line: a text or token ids (a list of one token list, as lm-eval sends it, too).
    prompt: Annotated[str, Field(min_length=1)] | list[Integer] | list[list[Integer]]
    logprobs: Integer | None = None
    echo: bool = False

    def request(self) -> JobParams:
        prompts = openai_items(self.prompt)
        if len(prompts) != 1 or not prompts[0]:
            raise ValueError("body.prompt: give one prompt a line, a text or token ids (several are several lines)")
        [prompt] = prompts
        scoring = {"logprobs": self.logprobs, "echo": self.echo}
        if isinstance(prompt, str):
            return self.params(prompt=prompt, **scoring)
        return self.params(prompt_token_ids=prompt, **scoring)


class EmbeddingBody(_Body):
    input: str | list[str] | list[Integer] | list[list[Integer]]
    encoding_format: Literal["float"] = "float"

    def request(self) -> JobParams:
        return EmbeddingParams(input=openai_items(self.input))


class ResponseLine(ResponseCreate):
    """A Responses API line: the route's body, less what needs a live call (a previous
    response to look up, a stream, background mode: a batch is in the background)."""

    model_config = ConfigDict(extra="ignore")

    def request(self) -> JobParams:
        for name in ("previous_response_id", "background", "stream"):
            if getattr(self, name):
                raise RequestError(400, f"{name}: not in batch lines (each line is one whole response)", param=name)
        params = self.params([])
        if params.max_tokens is None:
            return params.model_copy(update={"max_tokens": MAX_TOKENS_DEFAULT})
        return params


BODIES: dict[str, type[ChatBody] | type[CompletionBody] | type[EmbeddingBody] | type[ResponseLine]] = {
    CHAT: ChatBody,
    COMPLETIONS: CompletionBody,
    EMBEDDINGS: EmbeddingBody,
    RESPONSES: ResponseLine,
}


def parse_body(endpoint: str, body: Any) -> tuple[str, JobParams]:
    """(model, gpuq request) for one line's body; ValueError says what is wrong."""
    try:
        parsed = BODIES[endpoint].model_validate(body)
        request = parsed.request()
    except ValidationError as exc:
        refused = refusal(exc, prefix="body.")
        raise ValueError(refused.message) from None
    except RequestError as exc:
        raise ValueError(f"body.{exc.message}") from None
    return parsed.model, request


def token_usage(prompt: int | None, completion: int | None, cached: int | None) -> dict[str, Any]:
    """OpenAI's usage object; ``prompt_tokens_details.cached_tokens`` (OpenAI's own field) says
    how many of the prompt's tokens the worker reused instead of evaluating them."""
    prompt, completion = prompt or 0, completion or 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached or 0},
    }


def response_body(endpoint: str, job: Job, *, vectors: list[list[float]] | None = None) -> dict[str, Any]:
    """The OpenAI response object for a finished job (``vectors``: this line's share of a group)."""
    if endpoint == RESPONSES:
        return response_object(job)
    created = int(job.created_at.timestamp())
    prompt_tokens = job.prompt_tokens or 0
    result = job.result or {}
    if endpoint == EMBEDDINGS:
        data = vectors if vectors is not None else result.get("embeddings", [])
        return {
            "object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(data)],
            "model": job.model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        }
    usage = token_usage(job.prompt_tokens, job.completion_tokens, job.cached_tokens)
    chat = endpoint == CHAT
    return {
        "id": f"chatcmpl-{job.id}" if chat else f"cmpl-{job.id}",
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": job.model,
        "choices": choices(
            job.request or {}, result, chat=chat, message=lambda text, finish: chat_choice(job, text, finish)
        ),
        "usage": usage,
    }
