"""One generation's request, typed: its prompt and how to sample its continuation.

Every producer builds one (gpuq's jobs API, the OpenAI and Ollama routes, the Responses and
Anthropic Messages routes, batch lines), validated once, here; it travels as it is in its
job's ``JobSpec`` to submit's checks (its prompt, its context, its samples against the
workers' slots), is stored with :meth:`~gpuq.jobs.request.JobParams.stored`, and is read
back by the worker with :meth:`GenerationParams.from_stored`, typed and not validated again,
for the engine (worker/engine.py) and its sampler. gpuq/jobs/request.py holds what every
kind of request shares: the field types and their bounds, the producers' defaults, storing
and reading back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self

from pydantic import Field, ValidationError, model_validator

from gpuq.jobs import constraint, tool_calls
from gpuq.jobs.request import (
    MAX_SAMPLES,
    MAX_STOP_SEQUENCES,
    MAX_TOP_LOGPROBS,
    ChatMessage,
    Int,
    JobParams,
    MaxTokens,
    Penalty,
    Probability,
    RepeatPenalty,
    ResponseFields,
    Seed,
    Stop,
    Temperature,
    TokenIds,
    TopK,
    refusal,
    trusted,
)


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

    @classmethod
    def from_stored(cls, stored: Mapping[str, Any]) -> Self:
        """A job row's ``request`` read back, typed, without validating it again (its
        producer did); its messages and Responses fields typed too."""
        fields = dict(stored)
        if isinstance(fields.get("messages"), list):
            fields["messages"] = [trusted(ChatMessage, m) for m in fields["messages"]]
        if isinstance(fields.get("response"), Mapping):
            fields["response"] = trusted(ResponseFields, fields["response"])
        return trusted(cls, fields)

    def chat(self) -> list[dict[str, Any]] | None:
        """The messages as a chat template reads them (those that were stored: unset fields
        left out); None for a prompt given as text or token ids."""
        if self.messages is None:
            return None
        return [m.model_dump(mode="json", exclude_none=True) for m in self.messages]

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


def generation(status: int = 400, prefix: str = "", **fields: Any) -> GenerationParams:
    """A generation request from a producer's fields, or its route's refusal."""
    try:
        return GenerationParams.model_validate(fields)
    except ValidationError as exc:
        raise refusal(exc, status=status, prefix=prefix) from None
