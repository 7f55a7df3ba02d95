"""What leaves the decoder: finished requests with their generations, streamed pieces."""

from __future__ import annotations

from dataclasses import dataclass, field

from worker.decoding.logprobs import TokenLogprob


@dataclass(frozen=True, slots=True)
class Generation:
    """One sample of a request: its text, why it ended, and its tokens."""

    text: str
    finish_reason: str  # "stop", "length" or "cancelled"
    prompt_tokens: int
    completion_tokens: int
    token_ids: tuple[int, ...] = ()
    index: int = 0  # which of the request's n samples
    # Asked for only: each completion token's log-probability (as many as token_ids, less
    # those a stop string cut off), and with echo the prompt's (the first token has no
    # log-probability: nothing comes before it).
    logprobs: tuple[TokenLogprob, ...] | None = None
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None
    stop_sequence: str | None = None  # the stop string that ended it (finish reason stop), if one did
    # How it was computed, not what it is: the same text is the same generation.
    cached_tokens: int = field(default=0, compare=False)  # prompt tokens not computed: from a KV stream ...
    cached_ram_tokens: int = field(default=0, compare=False)  # ... of them, restored from the prefix cache's RAM
    cached_disk_tokens: int = field(default=0, compare=False)  # ... or from its disk tier
    parks: int = field(default=0, compare=False)  # times it gave its slot up to a more urgent job
    parked_ms: int = field(default=0, compare=False)  # ... and the time it waited, parked
    resumes: int = field(default=0, compare=False)  # times it took a slot again (a parked one may end first)
    prompt_ms: int | None = field(default=None, compare=False)  # admission to the first token
    eval_ms: int | None = field(default=None, compare=False)  # first token to the end


@dataclass(frozen=True, slots=True)
class Piece:
    """Text a streaming sequence produced in one step, covering ``tokens`` completion tokens.

    The pieces of a sequence add up exactly to its final text: text that could still become
    a stop string, or half a UTF-8 character, waits for the next token (as llama-cpp-python's
    own streaming holds it back)."""

    key: str
    text: str
    tokens: int
    index: int = 0
    logprobs: tuple[TokenLogprob, ...] = ()  # of the tokens it covers, when the request asked


@dataclass(frozen=True, slots=True)
class Finished:
    """A request that left the decoder: its generations (one per sample), or why it has none."""

    key: str
    generations: tuple[Generation, ...] = ()
    error: str | None = None  # the job failed (a deadline passed, damaged weights)
    evicted: bool = False  # no KV room: the job goes back to its queue, uncharged

    @property
    def generation(self) -> Generation | None:
        """The first sample (the only one unless the request asked for several)."""
        return self.generations[0] if self.generations else None


class DamagedModel(RuntimeError):
    """The model computed NaN or infinite numbers: its weights are damaged (a file whose
    header is fine but whose tensors are not). Its job fails; nothing non-finite is stored."""


DAMAGED_LOGITS = "the model produced non-finite logits (NaN or infinity): its weights are damaged"
PARKED_CELLS_REFUSED = "llama.cpp refused the KV cells of the parked sequence; it could not resume"
