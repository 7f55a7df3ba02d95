"""The events of a job's token stream, and how they are written in a Redis stream entry.

A job submitted by an interactive call (OpenAI's or Ollama's API) asks for events in its
request (``request["events"]``): ``tokens`` for every piece of text as the decoder samples
it, then the end; ``end`` for the end only (a call that answers once, an embedding). Its
worker then publishes, in this order, into ``gpuq:stream:<job id>``:

* :class:`Start` when an attempt starts decoding (the stream is emptied first, so a second
  attempt after a dead worker never mixes with the first);
* :class:`Delta` per piece of text, in order, each covering one token or more (text that
  could still turn out to be the start of a stop string, or half a UTF-8 character, waits
  for the next token), so the deltas add up to the job's final text and token count; a
  request of several samples (``n``) interleaves its samples' deltas, each with its ``index``;
* :class:`End` once the outcome is committed to SQL, with the usage figures, so whoever
  reads the end may read the job's row and find it final.

Each entry has one field, ``e``, holding the event as compact JSON.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

FIELD = b"e"
REQUEST_FIELD = "events"  # in a job's request: what its worker publishes
TOKENS = "tokens"  # every text delta, then the end
END_ONLY = "end"  # the end only


def wants_tokens(request: dict[str, Any]) -> bool:
    return request.get(REQUEST_FIELD) == TOKENS


def wants_end(request: dict[str, Any]) -> bool:
    return request.get(REQUEST_FIELD) in (TOKENS, END_ONLY)


@dataclass(frozen=True, slots=True)
class Start:
    attempt: int
    prompt_tokens: int | None = None
    load_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Delta:
    text: str
    tokens: int  # how many completion tokens this piece of text covers
    index: int = 0  # which of the request's samples (``n``) it belongs to
    logprobs: list[dict[str, Any]] | None = None  # its tokens' log-probabilities, when asked

    def then(self, later: Delta) -> Delta:
        """This delta and a later one of the same sample, as one."""
        logprobs = (
            None
            if self.logprobs is None and later.logprobs is None
            else [*(self.logprobs or []), *(later.logprobs or [])]
        )
        return Delta(self.text + later.text, self.tokens + later.tokens, self.index, logprobs)


@dataclass(frozen=True, slots=True)
class End:
    status: str  # succeeded, failed or cancelled
    finish_reason: str | None = None  # stop, length or cancelled (generations)
    finish_reasons: list[str] | None = None  # each sample's, in index order (a request of n > 1)
    error: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None  # of prompt_tokens, those reused from the worker's cache
    load_ms: int | None = None
    run_ms: int | None = None
    prompt_ms: int | None = None  # from the sequence's admission to its first token
    eval_ms: int | None = None  # from its first token to its end


Event = Start | Delta | End
_TYPES: dict[str, type[Start] | type[Delta] | type[End]] = {"start": Start, "delta": Delta, "end": End}
_NAMES = {cls: name for name, cls in _TYPES.items()}


def encode(event: Event) -> bytes:
    fields = {k: v for k, v in asdict(event).items() if v is not None}
    return json.dumps({"type": _NAMES[type(event)], **fields}, separators=(",", ":")).encode()


def decode(raw: bytes) -> Event:
    fields = json.loads(raw)
    return _TYPES[fields.pop("type")](**fields)
