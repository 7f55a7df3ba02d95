"""Ollama's request bodies (api/types.go), as gpuq takes them.

Unknown fields are ignored, as Ollama's server (Go's JSON decoder) ignores them. Fields that
ask for what gpuq cannot do (images, tools, JSON format, thinking, custom templates) are a
400 naming them; their defaults change nothing and are accepted.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpuq.dropin.ollama import Options, keep_alive_seconds, refuse, strip_tag
from gpuq.errors import RequestError
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
    format: Any = None
    think: bool | str | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, description="0 to 20: the most likely tokens at each place too")

    def _check(self) -> None:
        if self.format not in (None, ""):
            raise refuse("format", "structured (JSON) output is not supported")
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
            return {"prompt": self.prompt, **self._logprobs()}
        system = [{"role": "system", "content": self.system}] if self.system else []
        return {"messages": [*system, {"role": "user", "content": self.prompt}], **self._logprobs()}


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: str
    content: str = ""
    images: list[str] | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChatRequest(_Generating):
    """``POST /api/chat``."""

    messages: list[Message] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None

    def to_request(self) -> dict[str, Any]:
        self._check()
        if self.tools:
            raise refuse("tools", "gpuq generates text only")
        messages = []
        for i, message in enumerate(self.messages):
            role = message.role.lower()
            if role not in ("system", "user", "assistant"):
                raise refuse(f"messages[{i}].role", f"{message.role!r} (system, user or assistant)")
            if message.images:
                raise refuse(f"messages[{i}].images", "no multimodal models")
            if message.tool_calls:
                raise refuse(f"messages[{i}].tool_calls", "gpuq runs no tools")
            messages.append({"role": role, "content": message.content})
        return {"messages": messages, **self._logprobs()}


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
