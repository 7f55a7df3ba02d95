"""OpenAI's wire formats for batch lines: request bodies in, response bodies out.

Bodies map onto gpuq job requests (generation with ``prompt`` or ``messages``, embedding
with ``input``); results map back onto ``chat.completion``, ``text_completion`` and
embedding ``list`` objects, so the output file reads as OpenAI's would.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuq.batches.openai_choices import choices
from gpuq.db.tables import Job, JobKind
from gpuq.jobs.request import OPENAI_DEFAULTS, EmbeddingParams, GenerationParams, JobParams, openai_items, refusal

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
ENDPOINTS = {CHAT: JobKind.GENERATE, COMPLETIONS: JobKind.GENERATE, EMBEDDINGS: JobKind.EMBED}
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
    role: Literal["system", "user", "assistant", "developer"]
    content: str


class ChatBody(_Sampling):
    messages: list[_Message] = Field(min_length=1)
    logprobs: bool | None = None
    top_logprobs: Integer | None = None

    def request(self) -> JobParams:
        messages = [
            {"role": "system" if m.role == "developer" else m.role, "content": m.content} for m in self.messages
        ]
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("body.top_logprobs needs body.logprobs: true")
        return self.params(messages=messages, logprobs=(self.top_logprobs or 0) if self.logprobs else None)


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


BODIES: dict[str, type[ChatBody] | type[CompletionBody] | type[EmbeddingBody]] = {
    CHAT: ChatBody,
    COMPLETIONS: CompletionBody,
    EMBEDDINGS: EmbeddingBody,
}


def parse_body(endpoint: str, body: Any) -> tuple[str, dict[str, Any]]:
    """(model, gpuq request as stored) for one line's body; ValueError says what is wrong."""
    try:
        parsed = BODIES[endpoint].model_validate(body)
        request = parsed.request()
    except ValidationError as exc:
        refused = refusal(exc, prefix="body.")
        raise ValueError(refused.message) from None
    return parsed.model, request.stored()


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
        "choices": choices(job.request or {}, result, chat=chat),
        "usage": usage,
    }
