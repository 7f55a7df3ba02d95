"""The events of a job's token stream, and how they are written in a Redis stream entry.

A job submitted by an interactive call (OpenAI's or Ollama's API) asks for events in its
request (its ``events`` field): ``tokens`` for every piece of text as the decoder samples
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


def wants_tokens(events: str | None) -> bool:
    """Whether a request asking for ``events`` (its field of that name) wants every token."""
    return events == TOKENS


def wants_end(events: str | None) -> bool:
    return events in (TOKENS, END_ONLY)


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
    stop_sequence: str | None = None  # the stop string that ended the (first) sample, if one did
    error: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None  # of prompt_tokens, those reused from the worker's cache
    load_ms: int | None = None
    run_ms: int | None = None
    prompt_ms: int | None = None  # from the sequence's admission to its first token
    eval_ms: int | None = None  # from its first token to its end


def end_of_job(
    status: str,
    result: dict[str, Any] | None,
    *,
    error: str | None,
    prompt_tokens: int | None,
    completion_tokens: int | None,
    cached_tokens: int | None,
    load_ms: int | None,
    run_ms: int | None,
    prompt_ms: int | None = None,
    eval_ms: int | None = None,
) -> End:
    """A job's end from its final figures: what its worker publishes from the outcome, and what
    a follower builds from the job's row when no worker is left to publish it. Built here alone,
    so both carry the same finish reasons (each sample's, for a request of ``n``)."""
    result = result or {}
    return End(
        status=status,
        finish_reason=result.get("finish_reason"),
        finish_reasons=[choice["finish_reason"] for choice in result.get("choices", [])] or None,
        stop_sequence=result.get("stop_sequence"),
        error=error,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_tokens=cached_tokens,
        load_ms=load_ms,
        run_ms=run_ms,
        prompt_ms=prompt_ms,
        eval_ms=eval_ms,
    )


Event = Start | Delta | End


def ended_badly(job_id: str, end: End) -> str | None:
    """What a drop-in caller is told when its job did not succeed (both formats' error); None
    when it did."""
    if end.status == "succeeded":
        return None
    if end.status == "cancelled":
        return f"job {job_id} was cancelled" + (f": {end.error}" if end.error else "")  # why, if it was said
    return f"job {job_id} failed: {end.error or 'no reason recorded'}"


def restarted_mid_answer(job_id: str, event: Event, *, sent_text: bool) -> str | None:
    """A streamed answer's rule for a second :class:`Start` (its worker died and the job runs
    again from its start): text already sent cannot be taken back, so an answer that sent some
    ends here, with this message (the job's row keeps the new run); one that sent none takes the
    new run's text. None when the event is no such restart."""
    if not (isinstance(event, Start) and sent_text):
        return None
    return (
        f"the worker running job {job_id} stopped; the job is running again (attempt {event.attempt}) "
        f"and its text so far cannot be taken back: read GET /v1/jobs/{job_id}"
    )


_TYPES: dict[str, type[Start] | type[Delta] | type[End]] = {"start": Start, "delta": Delta, "end": End}
_NAMES = {cls: name for name, cls in _TYPES.items()}


def encode(event: Event) -> bytes:
    fields = {k: v for k, v in asdict(event).items() if v is not None}
    return json.dumps({"type": _NAMES[type(event)], **fields}, separators=(",", ":")).encode()


def decode(raw: bytes) -> Event:
    fields = json.loads(raw)
    return _TYPES[fields.pop("type")](**fields)
