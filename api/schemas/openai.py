"""OpenAI's request bodies for chat completions, completions and embeddings, as gpuq takes them.

Fields gpuq honours are declared. Fields that change nothing when left at their defaults
(``user``, ``store``, ...) are accepted and ignored, as OpenAI-compatible servers do; a field
that asks for something gpuq cannot do (audio, ``logit_bias``, a JSON schema keyword the
engine cannot enforce) is a 400 naming it, never silently dropped. ``response_format``,
``tools`` and ``tool_choice`` are read as batch lines read them
(gpuq/batches/openai_format.py). llama.cpp's own sampling knobs
(``top_k``, ``min_p``, ``repeat_penalty``) are accepted as extensions, as llama.cpp's server does.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpuq.batches.openai_format import chat_message, output_schema, tool_fields
from gpuq.errors import RequestError
from gpuq.jobs.generation_params import GenerationParams, generation
from gpuq.jobs.request import (
    MAX_EMBED_INPUTS,
    MAX_TOP_LOGPROBS,
    OPENAI_DEFAULTS,
    EmbeddingParams,
    embedding,
    openai_items,
)

# Accepted and ignored: they change nothing gpuq does (identifiers, storage; service tiers on
# embeddings, which OpenAI's embeddings API does not have, chat and completions honour them;
# parallel_tool_calls where there are no tools, chat honours it).
IGNORED = frozenset({"user", "store", "metadata", "service_tier", "parallel_tool_calls", "prompt_cache_key"})


class _Lenient(BaseModel):
    # Unknown fields are kept to be named in the 400 (OpenAI answers "unrecognized request argument").
    model_config = ConfigDict(extra="allow")

    def _refuse_unknown(self) -> None:
        unknown = sorted(set(self.model_extra or {}) - IGNORED)
        if unknown:
            raise RequestError(
                400, f"unrecognized request argument supplied: {unknown[0]}", param=unknown[0], code="unknown_parameter"
            )


def unsupported(param: str, why: str) -> RequestError:
    return RequestError(400, f"{param} is not supported by gpuq: {why}", param=param, code="unsupported_parameter")


class StreamOptions(BaseModel):
    include_usage: bool = False
    include_obfuscation: bool | None = None  # OpenAI's padding of chunks; nothing to pad here


# Numbers as JSON numbers (a boolean is not one); their ranges are checked where the request
# is built (gpuq/jobs/request.py), a 400 as OpenAI answers.
Number = Annotated[float, Field(strict=True)]
Integer = Annotated[int, Field(strict=True)]


class _Sampling(_Lenient):
    model: str = Field(min_length=1, max_length=128)
    max_tokens: Integer | None = Field(None, description="default: what the context leaves after the prompt")
    max_completion_tokens: Integer | None = None
    temperature: Number | None = Field(None, description="0 to 2; default 1")
    top_p: Number | None = Field(None, description="0 to 1; default 1")
    seed: Integer | None = Field(None, description="0 to 2^32 - 1")
    stop: str | list[str] | None = None
    frequency_penalty: Number | None = Field(None, description="-2 to 2; default 0")
    presence_penalty: Number | None = Field(None, description="-2 to 2; default 0")
    n: Integer = Field(1, description="choices to generate from the one prompt (evaluated once), 1 to 128")
    stream: bool = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = Field(
        None, description='{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": {...}}'
    )
    top_k: Integer | None = Field(None, description="gpuq extension (llama.cpp's sampler); default 0, off")
    min_p: Number | None = Field(None, description="gpuq extension (llama.cpp's sampler); default 0, off")
    repeat_penalty: Number | None = Field(None, description="gpuq extension (llama.cpp's sampler); default 1, off")
    keep_alive: Number | None = Field(
        None, description="gpuq extension: seconds the model stays loaded afterwards (-1 to 604800)"
    )
    service_tier: Literal["auto", "default", "flex", "priority"] | None = Field(
        None,
        description="flex runs at low priority, priority at high, auto and default at the key's; "
        "echoed in the answer (X-Gpuq-Priority, if also given, must agree)",
    )

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def _check_sampling(self) -> None:
        self._refuse_unknown()
        if self.logit_bias:
            raise unsupported("logit_bias", "the sampler takes no token biases")
        if self.stream_options is not None and not self.stream:
            raise RequestError(400, "stream_options is only allowed with stream: true", param="stream_options")

    def params(self, **prompt: Any) -> GenerationParams:
        """gpuq's generation request for ``prompt`` (``prompt=`` or ``messages=``, and
        ``logprobs=``/``echo=``), OpenAI's defaults where a field is not given; a 400 naming
        the first value out of its range."""
        given = {
            "n": self.n,
            "max_tokens": self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "stop": [self.stop] if isinstance(self.stop, str) else self.stop,
            "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repeat_penalty": self.repeat_penalty,
            "keep_alive": self.keep_alive,
            "json_schema": output_schema(self.response_format),
        }
        chosen = OPENAI_DEFAULTS | {k: v for k, v in given.items() if v is not None}
        return generation(**chosen, **prompt)


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_call_id ...: checked below
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None

    def message(self, index: int) -> dict[str, Any]:
        """The message as the job's request stores it (tool calls and results kept)."""
        if self.role == "function":
            raise unsupported(f"messages[{index}]", "function messages of the legacy functions API: send tool messages")
        extra = self.model_extra or {}
        calls, call_id = extra.get("tool_calls"), extra.get("tool_call_id")
        return chat_message(self.role, self.text(index), tool_calls=calls, tool_call_id=call_id, index=index)

    def text(self, index: int) -> str:
        """The message's text; image, audio or file parts are refused, naming the message."""
        if isinstance(self.content, str) or self.content is None:
            return self.content or ""
        texts = []
        for j, part in enumerate(self.content):
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise unsupported(
                    f"messages[{index}].content[{j}]", f"content parts of type {part.get('type')!r} (only text)"
                )
            texts.append(part["text"])
        return "".join(texts)


class ChatCompletionCreate(_Sampling):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessageIn] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = Field(None, description="function tools, rendered by the model's template")
    tool_choice: str | dict[str, Any] | None = Field(
        None, description='none, auto (default), required or {"type": "function", "function": {"name": ...}}'
    )
    parallel_tool_calls: bool | None = Field(None, description="false: at most one tool call (default: several may)")
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    logprobs: bool | None = Field(None, description="each answer token's log-probability (choices[].logprobs.content)")
    top_logprobs: Integer | None = Field(None, description="0 to 20: the most likely tokens at each place too")
    modalities: list[str] | None = None
    reasoning_effort: str | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None

    def to_request(self) -> GenerationParams:
        """gpuq's generation request; a 400 naming the first parameter gpuq cannot honour."""
        self._check_sampling()
        for name in ("audio", "prediction", "web_search_options"):
            if getattr(self, name):
                raise unsupported(name, "gpuq generates text only (no audio or predicted outputs)")
        if self.functions or self.function_call not in (None, "none"):
            which = "functions" if self.functions else "function_call"
            raise unsupported(which, "the legacy functions API: send tools")
        if self.top_logprobs is not None and not self.logprobs:
            raise RequestError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise RequestError(400, f"top_logprobs: 0 to {MAX_TOP_LOGPROBS}", param="top_logprobs")
        if self.modalities and self.modalities != ["text"]:
            raise unsupported("modalities", "text only")
        if self.reasoning_effort is not None:
            raise unsupported("reasoning_effort", "no reasoning models")
        messages = [m.message(i) for i, m in enumerate(self.messages)]
        if not any(m["content"] or m.get("tool_calls") for m in messages):
            raise RequestError(400, "messages are all empty: at least one needs content", param="messages")
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        tools = tool_fields(self.tools, self.tool_choice, parallel=self.parallel_tool_calls is not False)
        return self.params(messages=messages, logprobs=logprobs, **tools)


class CompletionCreate(_Sampling):
    """``POST /v1/completions`` (the legacy completions API)."""

    prompt: str | list[str] | list[Integer] | list[list[Integer]] = Field(
        description="one prompt: a text or token ids (run as given, no BOS added); a list of one of either is taken too"
    )
    logprobs: Integer | None = Field(
        None, description="0 to 20: each token's log-probability and this many alternatives (choices[].logprobs)"
    )
    echo: bool = Field(False, description="the answer repeats the prompt first (with logprobs: its tokens' too)")
    suffix: str | None = None
    best_of: int | None = None

    def to_request(self) -> GenerationParams:
        self._check_sampling()
        prompts = openai_items(self.prompt)
        if len(prompts) != 1:
            raise unsupported("prompt", "one prompt per request (send one request per prompt)")
        if self.echo and self.stream:
            raise unsupported("echo", "with stream: true (the prompt's tokens come in the answer: ask without stream)")
        if self.suffix:
            raise unsupported("suffix", "no fill-in-the-middle")
        if self.best_of not in (None, 1):
            raise unsupported("best_of", "one candidate per request")
        [one] = prompts
        if not one:
            raise RequestError(400, "prompt is empty", param="prompt")
        scoring = {"logprobs": self.logprobs, "echo": self.echo}
        if isinstance(one, list):
            return self.params(prompt_token_ids=one, **scoring)
        return self.params(prompt=one, **scoring)


class EmbeddingCreate(_Lenient):
    """``POST /v1/embeddings``."""

    model: str = Field(min_length=1, max_length=128)
    input: str | list[str] | list[Integer] | list[list[Integer]] = Field(
        description="one text or a list of texts; or token ids, one list or a list of them (run as given)"
    )
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Integer | None = Field(None, ge=1, description="the vectors' first N dimensions, normalised again")
    keep_alive: Number | None = Field(None, description="gpuq extension (-1 to 604800)")

    def to_request(self) -> EmbeddingParams:
        self._refuse_unknown()
        inputs = openai_items(self.input)
        if not inputs:
            raise RequestError(400, "input is an empty list: give at least one text", param="input")
        if len(inputs) > MAX_EMBED_INPUTS:
            raise RequestError(400, f"input has {len(inputs)} inputs; at most {MAX_EMBED_INPUTS}", param="input")
        for i, item in enumerate(inputs):
            if not item:
                raise RequestError(400, f"input[{i}] is empty", param="input")
        return embedding(input=inputs, keep_alive=self.keep_alive)


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True
