"""Anthropic's Messages API as gpuq takes it: a request body in (the message object out is
gpuq/batches/anthropic_messages.py's).

One parser for both of its producers: ``POST /v1/messages`` (api/routers/anthropic.py) and
the ``params`` of each request of a Message Batch (gpuq/batches/message_batches.py). A
request becomes an ordinary chat generation (``GenerationParams`` with ``messages``), so the
engine never learns a third vocabulary:

- ``system`` (a string or text blocks) is the first, ``system``, message;
- a user's ``tool_result`` blocks become ``tool`` messages naming the call they answer, its
  text blocks a ``user`` message, in the blocks' order; an assistant's ``tool_use`` blocks
  become its ``tool_calls`` (OpenAI's shape, which the chat templates render);
- ``tools`` (``name``, ``description``, ``input_schema``) become function tools, and
  ``tool_choice`` ``auto``/``any``/``tool``/``none`` OpenAI's ``auto``/``required``/a named
  function/``none``: ``any`` and ``tool`` are enforced while sampling (gpuq/jobs/tool_calls.py).

``output_config.format`` (a JSON schema, what the SDK's ``messages.parse`` sends) is enforced
while sampling, as OpenAI's ``response_format`` is.

What gpuq cannot honour is a 400 naming it, never dropped: image and document blocks,
server tools, extended thinking, an assistant prefill (the template starts a new turn, it
does not continue one). ``cache_control`` is accepted and changes nothing: gpuq's workers
reuse any prompt's cached start on their own, and say so in ``cache_read_input_tokens``.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuq.batches.openai_format import tool_fields
from gpuq.errors import RequestError
from gpuq.jobs.constraint import enforceable
from gpuq.jobs.generation_params import GenerationParams, generation
from gpuq.jobs.request import MAX_STOP_SEQUENCES, OPENAI_DEFAULTS, refusal

MESSAGES = "/v1/messages"
# Anthropic's pattern for a tool's name and a batch request's custom_id.
NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
# Anthropic documents what OpenAI does: temperature 1, and top_p and top_k off unless given.
DEFAULTS = OPENAI_DEFAULTS

Number = Annotated[float, Field(strict=True)]
Integer = Annotated[int, Field(strict=True)]


def unsupported(param: str, why: str) -> RequestError:
    return RequestError(400, f"{param}: {why} is not supported by gpuq", param=param, code="unsupported_parameter")


class TextBlock(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None  # gpuq reuses cached prompt starts unasked
    citations: list[dict[str, Any]] | None = None


class InputMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]] = Field(description="a text, or text, tool_use and tool_result blocks")


class Metadata(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user_id: str | None = Field(None, max_length=256)


class MessageCreate(BaseModel):
    """``POST /v1/messages`` (and each ``params`` of a Message Batch)."""

    model_config = ConfigDict(extra="forbid")  # as Anthropic's API: an unknown field is a 400 naming it

    model: str = Field(min_length=1, max_length=128)
    max_tokens: Integer = Field(ge=1, description="required, as Anthropic requires it")
    messages: list[InputMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = Field(None, description=f"at most {MAX_STOP_SEQUENCES}")
    temperature: Number | None = Field(None, ge=0.0, le=1.0, description="0 to 1; default 1")
    top_p: Number | None = Field(None, gt=0.0, le=1.0)
    top_k: Integer | None = Field(None, ge=0)
    metadata: Metadata | None = Field(None, description="accepted; changes nothing")
    tools: list[dict[str, Any]] | None = Field(None, description="custom tools: name, description, input_schema")
    tool_choice: dict[str, Any] | None = Field(None, description="auto, any, tool (with name) or none")
    stream: bool = False
    thinking: dict[str, Any] | None = Field(None, description='only {"type": "disabled"}: no reasoning models')
    service_tier: Literal["auto", "standard_only"] | None = Field(None, description="accepted; changes nothing")
    cache_control: dict[str, Any] | None = Field(None, description="accepted; gpuq reuses cached prompt starts unasked")
    output_config: dict[str, Any] | None = Field(
        None, description='structured output: {"format": {"type": "json_schema", "schema": {...}}}, enforced'
    )

    def to_request(self) -> GenerationParams:
        """gpuq's generation request; a 400 naming the first thing gpuq cannot honour."""
        if self.thinking is not None and self.thinking.get("type") != "disabled":
            raise unsupported("thinking", "extended thinking")
        stops = self.stop_sequences or []
        if len(stops) > MAX_STOP_SEQUENCES:
            raise RequestError(
                400, f"stop_sequences: at most {MAX_STOP_SEQUENCES} (the sampler's limit)", param="stop_sequences"
            )
        if any(not s for s in stops):
            raise RequestError(400, "stop_sequences: each must be a non-empty string", param="stop_sequences")
        messages = [*_system(self.system), *_messages(self.messages)]
        schema = _output_schema(self.output_config)
        if schema is not None and self.tools:
            raise unsupported("output_config.format", "a JSON format beside tools")
        given = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}
        return generation(
            **(DEFAULTS | {k: v for k, v in given.items() if v is not None}),
            max_tokens=self.max_tokens,
            stop=stops,
            messages=messages,
            json_schema=schema,
            **_tools(self.tools, self.tool_choice),
        )


class CountTokensCreate(BaseModel):
    """``POST /v1/messages/count_tokens``: what a message would take, without running it."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1, max_length=128)
    messages: list[InputMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    cache_control: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None

    def to_request(self) -> GenerationParams:
        return MessageCreate(
            model=self.model,
            max_tokens=1,
            messages=self.messages,
            system=self.system,
            tools=self.tools,
            tool_choice=self.tool_choice,
            thinking=self.thinking,
            output_config=self.output_config,
        ).to_request()


# ---------------------------------------------------------------- request in


def _output_schema(config: dict[str, Any] | None) -> dict[str, Any] | None:
    """``output_config.format`` as the JSON schema the answer must match, enforced while
    sampling (the SDK's ``messages.parse`` sends it); ``effort`` is for reasoning models."""
    if not config:
        return None
    unknown = sorted(set(config) - {"format", "effort"})
    if unknown:
        where = f"output_config.{unknown[0]}"
        raise RequestError(400, f"{where}: Extra inputs are not permitted", param=where)
    if config.get("effort") is not None:
        raise unsupported("output_config.effort", "an effort level (no reasoning models)")
    spec = config.get("format")
    if spec is None:
        return None
    if not isinstance(spec, dict) or spec.get("type") != "json_schema" or not isinstance(spec.get("schema"), dict):
        raise RequestError(
            400, 'output_config.format: {"type": "json_schema", "schema": {...}}', param="output_config.format"
        )
    return enforceable(spec["schema"], "output_config.format.schema")


def _system(system: str | list[TextBlock] | None) -> list[dict[str, Any]]:
    text = system if isinstance(system, str) or system is None else "".join(b.text for b in system)
    return [{"role": "system", "content": text}] if text else []


def _messages(messages: list[InputMessage]) -> list[dict[str, Any]]:
    if messages[-1].role == "assistant":
        where = f"messages[{len(messages) - 1}]"
        raise RequestError(
            400,
            f"{where}: a last message from the assistant (a prefill) is not supported by gpuq: the chat template "
            "starts a new turn instead of continuing it; end with a user message",
            param=where,
            code="unsupported_parameter",
        )
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        blocks = [{"type": "text", "text": message.content}] if isinstance(message.content, str) else message.content
        if message.role == "user":
            out += _user(blocks, i)
        else:
            out.append(_assistant(blocks, i))
    if not any(m["content"] or m.get("tool_calls") for m in out):
        raise RequestError(400, "messages are all empty: at least one needs content", param="messages")
    return out


def _block_type(block: Any, where: str, allowed: tuple[str, ...]) -> str:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind in allowed:
        return str(kind)
    if kind in ("image", "document", "search_result", "container_upload"):
        raise unsupported(where, f"a content block of type {kind!r} (gpuq's models read text only)")
    raise RequestError(400, f"{where}: a block of type {kind!r} is not one of {', '.join(allowed)} here", param=where)


def _text(block: dict[str, Any], where: str) -> str:
    try:
        return TextBlock.model_validate(block).text
    except ValidationError as exc:
        raise refusal(exc, prefix=f"{where}.") from None


def _user(blocks: list[dict[str, Any]], i: int) -> list[dict[str, Any]]:
    """A user's turn: its tool results as ``tool`` messages, its text as a user message, in order."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, block in enumerate(blocks):
        where = f"messages[{i}].content[{j}]"
        if _block_type(block, where, ("text", "tool_result")) == "text":
            texts.append(_text(block, where))
            continue
        if texts:
            out.append({"role": "user", "content": "".join(texts)})
            texts = []
        out.append(_tool_result(block, where))
    if texts or not out:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise RequestError(
            400, f"{where}.tool_use_id: name the tool_use block it answers", param=f"{where}.tool_use_id"
        )
    unknown = sorted(set(block) - {"type", "tool_use_id", "content", "is_error", "cache_control"})
    if unknown:
        raise RequestError(400, f"{where}.{unknown[0]}: Extra inputs are not permitted", param=f"{where}.{unknown[0]}")
    content = block.get("content", "")
    if isinstance(content, list):
        parts = [
            _text(part, f"{where}.content[{k}]")
            for k, part in enumerate(content)
            if _block_type(part, f"{where}.content[{k}]", ("text",))
        ]
        content = "".join(parts)
    elif not isinstance(content, str):
        raise RequestError(400, f"{where}.content: a text or text blocks", param=f"{where}.content")
    if block.get("is_error") is True:
        content = f"Error: {content}"
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def _assistant(blocks: list[dict[str, Any]], i: int) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        where = f"messages[{i}].content[{j}]"
        if _block_type(block, where, ("text", "tool_use")) == "text":
            texts.append(_text(block, where))
            continue
        name, call_id, arguments = block.get("name"), block.get("id"), block.get("input", {})
        if not isinstance(name, str) or not isinstance(call_id, str) or not isinstance(arguments, dict):
            raise RequestError(
                400, f'{where}: a tool_use block is {{"type": "tool_use", "id": ..., "name": ..., "input": {{...}}}}',
                param=where,
            )  # fmt: skip
        function = {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}
        calls.append({"id": call_id, "type": "function", "function": function})
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        message["tool_calls"] = calls
    return message


def _tools(tools: list[dict[str, Any]] | None, choice: dict[str, Any] | None) -> dict[str, Any]:
    """Anthropic's tools and tool_choice as OpenAI's, which the job's request stores
    (``disable_parallel_tool_use`` as ``parallel_tool_calls: false``)."""
    functions = [_function(tool, i) for i, tool in enumerate(tools or [])]
    return tool_fields(functions or None, _choice(choice), parallel=not _one_call(choice))


def _function(tool: Any, i: int) -> dict[str, Any]:
    where = f"tools[{i}]"
    if not isinstance(tool, dict):
        raise RequestError(400, f"{where}: a tool is an object with name and input_schema", param=where)
    if tool.get("type") not in (None, "custom"):
        raise unsupported(f"{where}.type", f"the server tool {tool.get('type')!r} (only custom tools)")
    unknown = sorted(set(tool) - {"type", "name", "description", "input_schema", "cache_control"})
    if unknown:
        raise RequestError(400, f"{where}.{unknown[0]}: Extra inputs are not permitted", param=f"{where}.{unknown[0]}")
    name, schema = tool.get("name"), tool.get("input_schema")
    if not isinstance(name, str) or not NAME.match(name):
        raise RequestError(400, f"{where}.name: 1 to 64 letters, digits, _ or -", param=f"{where}.name")
    if not isinstance(schema, dict):
        raise RequestError(400, f"{where}.input_schema: the JSON schema of its input", param=f"{where}.input_schema")
    function = {"name": name, "parameters": schema}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _one_call(choice: dict[str, Any] | None) -> bool:
    disable = (choice or {}).get("disable_parallel_tool_use", False)
    if not isinstance(disable, bool):
        where = "tool_choice.disable_parallel_tool_use"
        raise RequestError(400, f"{where}: Input should be a valid boolean", param=where)
    return disable


def _choice(choice: dict[str, Any] | None) -> str | dict[str, Any] | None:
    if choice is None:
        return None
    kind = choice.get("type")
    allowed = {"auto": {"disable_parallel_tool_use"}, "any": {"disable_parallel_tool_use"}, "none": set()}
    allowed["tool"] = {"name", "disable_parallel_tool_use"}
    if kind not in allowed:
        raise RequestError(400, "tool_choice.type: auto, any, tool or none", param="tool_choice.type")
    unknown = sorted(set(choice) - {"type"} - allowed[kind])
    if unknown:
        raise RequestError(400, f"tool_choice.{unknown[0]}: Extra inputs are not permitted", param="tool_choice")
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise RequestError(400, "tool_choice.name: the tool to call", param="tool_choice.name")
        return {"type": "function", "function": {"name": choice["name"]}}
    return {"auto": "auto", "any": "required", "none": "none"}[kind]


def parse_params(body: Any) -> tuple[str, GenerationParams]:
    """(model, gpuq request) for one Message Batch request's params; ValueError
    says what is wrong (streaming is refused: a batch answers at its end)."""
    try:
        parsed = MessageCreate.model_validate(body)
        if parsed.stream:
            raise RequestError(400, "stream: a batch's requests are not streamed", param="stream")
        request = parsed.to_request()
    except ValidationError as exc:
        raise ValueError(refusal(exc, prefix="params.").message) from None
    except RequestError as exc:
        raise ValueError(f"params.{exc.message}") from None
    return parsed.model, request.model_copy(update={"endpoint": MESSAGES})
