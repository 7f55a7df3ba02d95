"""Ollama's request bodies (api/types.go), as gpuq takes them.

Unknown fields are ignored, as Ollama's server (Go's JSON decoder) ignores them. Fields that
ask for what gpuq cannot do (images, thinking, custom templates, a JSON schema keyword the
engine cannot enforce) are a 400 naming them; their defaults change nothing and are accepted.
``format`` ("json" or a JSON schema) is enforced while sampling; ``tools`` are rendered by
the model's chat template and the calls read back from its reply.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpuq.dropin.ollama import Options, keep_alive_seconds, refuse, strip_tag
from gpuq.errors import RequestError
from gpuq.jobs.constraint import ANY_OBJECT, enforceable
from gpuq.jobs.request import MAX_EMBED_INPUTS, MAX_TOP_LOGPROBS, EmbeddingParams, embedding


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1, max_length=140)
    # Checked by keep_alive_seconds, so that a boolean or NaN is a 400 like any bad value here.
    keep_alive: Any = Field(
        None,
        description='how long the model stays loaded afterwards: seconds, or a duration ("5m"); negative: forever',
        json_schema_extra={"anyOf": [{"type": "number"}, {"type": "string"}, {"type": "null"}]},
    )
    options: dict[str, Any] | None = Field(
        None, description="num_predict, num_ctx, temperature, top_p, top_k, min_p, seed, stop, repeat_penalty, ..."
    )

    @property
    def name(self) -> str:
        return strip_tag(self.model)

    def keep_alive_s(self) -> float | None:
        return keep_alive_seconds(self.keep_alive)

    def parsed_options(self) -> Options:
        return Options.parse(self.options or {})


class _Generating(_Request):
    stream: bool = True
    format: Any = Field(
        None,
        description='"json" (any JSON object) or a JSON schema: the answer matches it, enforced while sampling',
        json_schema_extra={"anyOf": [{"type": "string"}, {"type": "object"}, {"type": "null"}]},
    )
    think: bool | str | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, description="0 to 20: the most likely tokens at each place too")

    def _output(self) -> dict[str, Any]:
        """``format`` as the job request's ``json_schema`` field (none: plain text)."""
        if self.format in (None, ""):
            return {}
        if self.format == "json":
            return {"json_schema": ANY_OBJECT}
        if isinstance(self.format, dict):
            return {"json_schema": enforceable(self.format, "format")}
        raise RequestError(400, 'format must be "json" or a JSON schema (an object)', param="format")

    def _check(self) -> None:
        if self.think not in (None, False):
            raise refuse("think", "no thinking models")
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise RequestError(400, f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}", param="top_logprobs")

    def _logprobs(self) -> dict[str, Any]:
        """Ollama's: ``logprobs`` for each token's, ``top_logprobs`` for alternatives (with logprobs)."""
        return {"logprobs": self.top_logprobs or 0} if self.logprobs else {}


class GenerateRequest(_Generating):
    """``POST /api/generate``."""

    prompt: str = ""
    system: str = ""
    suffix: str = ""
    template: str = ""
    raw: bool = False
    context: list[int] | None = None
    images: list[str] | None = None

    def to_request(self) -> dict[str, Any]:
        self._check()
        if self.images:
            raise refuse("images", "no multimodal models")
        if self.template:
            raise refuse("template", "gpuq renders the model's own chat template")
        if self.suffix:
            raise refuse("suffix", "no fill-in-the-middle")
        if self.context:
            raise refuse("context", "send the conversation to /api/chat as messages instead")
        if self.raw:
            if self.system:
                raise RequestError(400, "raw mode does not support template, system, or context")
            return {"prompt": self.prompt, **self._output(), **self._logprobs()}
        system = [{"role": "system", "content": self.system}] if self.system else []
        user = {"role": "user", "content": self.prompt}
        return {"messages": [*system, user], **self._output(), **self._logprobs()}


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: str
    content: str = ""
    images: list[str] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_name: str | None = Field(None, description="a tool message's function")


class ChatRequest(_Generating):
    """``POST /api/chat``."""

    messages: list[Message] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = Field(None, description="functions the model may call (as OpenAI's tools)")

    def to_request(self) -> dict[str, Any]:
        self._check()
        messages = []
        for i, message in enumerate(self.messages):
            role = message.role.lower()
            if role not in ("system", "user", "assistant", "tool"):
                raise refuse(f"messages[{i}].role", f"{message.role!r} (system, user, assistant or tool)")
            if message.images:
                raise refuse(f"messages[{i}].images", "no multimodal models")
            entry: dict[str, Any] = {"role": role, "content": message.content}
            if message.tool_calls:
                if role != "assistant" or not all(isinstance(c.get("function"), dict) for c in message.tool_calls):
                    raise RequestError(400, f"messages[{i}].tool_calls: an assistant's calls, each with a function")
                entry["tool_calls"] = message.tool_calls
            if role == "tool" and message.tool_name:
                entry["name"] = message.tool_name
            messages.append(entry)
        tools = {"tools": self.tools} if self.tools else {}
        return {"messages": messages, **self._output(), **tools, **self._logprobs()}


class EmbedRequest(_Request):
    """``POST /api/embed``."""

    input: str | list[str]
    truncate: bool = True
    dimensions: int | None = Field(None, ge=1)

    def params(self) -> EmbeddingParams:
        texts = [self.input] if isinstance(self.input, str) else self.input
        if len(texts) > MAX_EMBED_INPUTS:
            raise RequestError(400, f"input has {len(texts)} texts; at most {MAX_EMBED_INPUTS}", param="input")
        for i, text in enumerate(texts):
            if not text:
                raise RequestError(400, f"input[{i}] is empty")
        return embedding(input=texts, keep_alive=self.keep_alive_s())


class EmbeddingsRequest(_Request):
    """``POST /api/embeddings`` (Ollama's older embedding route: one prompt, one vector)."""

    prompt: str = ""

    def params(self) -> EmbeddingParams:
        return embedding(input=[self.prompt], keep_alive=self.keep_alive_s())


class ShowRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str = ""
    name: str = Field("", description="the older spelling of model")
    verbose: bool = False

    @property
    def model_name(self) -> str:
        return strip_tag(self.model or self.name)


class PullRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str = ""
    name: str = ""
    stream: bool = True


class ProgressResponse(BaseModel):
    status: Literal["success"] = "success"


class VersionResponse(BaseModel):
    version: str
