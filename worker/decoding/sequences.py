"""Requests and their sequences, each sequence in an explicit state.

- a **request** is one job's generation: a prompt, sampling, end rules and its ``n``
  sequences; it ends when all of them have, and is settled as one job;
- a **sequence** is one sample being generated: its own id (never reused), its own sampler
  chain (seeded ``seed + index``), its own text, and a state:

  ``WAITING``: a sample of ``n``, made at admission, waiting for its request's prompt to go
  in; it holds no KV stream (the request was admitted with a free stream for it), and is
  forked from the first sample once the prompt is in (the stream copied);
  ``PREFILLING``: its prompt going in, a chunk at a time; ``DECODING``: a token sampled each
  step; ``PARKED``: a decoding sequence that gave its stream up to a more urgent request, its
  cells kept in host memory, its sampler, text and position as they were (``parking.py``),
  until a stream is free again; ``FINISHED``: with a reason.

Which KV stream a sequence holds is ``KvStreams``'s to say (``kv_streams.py``), nobody else's.
"""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from worker.decoding.constraint import SequenceConstraint
from worker.decoding.logprobs import TokenLogprob
from worker.decoding.sampler import Sampling
from worker.decoding.text import CompletionText


class State(enum.Enum):
    WAITING = "waiting"  # for its request's prompt: then forked from the first sample
    PREFILLING = "prefilling"  # its prompt going in, a chunk at a time
    DECODING = "decoding"  # a token sampled each step
    PARKED = "parked"  # its cells in host memory, its stream given to a more urgent request
    FINISHED = "finished"


@dataclass(eq=False, slots=True)
class Sequence:
    id: int
    request: Request
    index: int  # which of the request's n samples
    sampler: Any  # llama_cpp._internals.LlamaSampler (closed when the sequence finishes)
    text: CompletionText
    constraint: SequenceConstraint | None = None  # structured output: the grammar its tokens must match
    state: State = State.PREFILLING
    fed: int = 0  # prompt tokens whose KV its stream holds
    completion: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    cut: int | None = None  # where a stop string cut the text
    unsent_tokens: int = 0  # streaming: tokens not yet covered by a piece
    first_token_at: float | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)  # when the request asked
    starts: list[int] = field(default_factory=list)  # ... and where each token's bytes start
    # Parked (parking.py): its stream's cells and reusable prompt tokens, kept until it resumes.
    parked_cells: bytes | None = None
    parked_reusable: list[int] = field(default_factory=list)
    parked_since: float | None = None
    parks: int = 0  # times it was parked
    waited_steps: int = 0  # steps it skipped for more urgent sequences (strict priority)
    resumes: int = 0  # ... and resumed
    parked_s: float = 0.0  # time spent parked

    @property
    def position(self) -> int:
        """The position of the last sampled token, the one the next decode row carries."""
        return self.fed + len(self.completion) - 1

    @property
    def pending(self) -> int | None:
        """The token sampled last and not yet decoded (None unless decoding)."""
        return self.completion[-1] if self.state is State.DECODING else None

    def text_bytes(self) -> bytes:
        """Its text as it ends: cut where a stop string began."""
        data = self.text.data
        return bytes(data[: self.cut] if self.cut is not None else data)


@dataclass(eq=False, slots=True)
class Request:
    key: str
    prompt: list[int]
    max_tokens: int
    sampling: Sampling
    stops: list[str]
    cancel: threading.Event
    deadline: float | None
    stream: bool
    admitted: int  # admission order: the newest request is the one sent back when KV runs out
    priority: int = 1  # its job's (gpuq.queue_names.Priority: lower is more urgent)
    scope: bytes = b""  # its cache scope (the model file and the tenant)
    logprobs: int | None = None  # None: none wanted; k: each token's and its k best alternatives'
    echo: bool = False  # the prompt's log-probabilities too (every prompt row decoded with logits)
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    cached: int = 0  # prompt tokens its stream held at admission: a stream's, or restored from
    cached_ram: int = 0  # ... of them, restored from the prefix cache's RAM tier
    cached_disk: int = 0  # ... or from its disk tier
    admitted_at: float = field(default_factory=time.perf_counter)
    sequences: list[Sequence] = field(default_factory=list)  # its n samples, by index

    @property
    def finished(self) -> bool:
        return all(s.state is State.FINISHED for s in self.sequences)


class Sequences:
    """The decoder's requests and sequences by state: ``live`` hold a KV stream (prefilling or
    decoding), ``waiting`` wait for their request's prompt. Read by the desk's thread too
    (``free_slots``, ``active``): only sizes and key lists, each one atomic read."""

    def __init__(self) -> None:
        self.requests: dict[str, Request] = {}
        self.live: dict[int, Sequence] = {}  # sequence id -> sequence holding a stream
        self.waiting: dict[int, Sequence] = {}  # sequence id -> sequence waiting for a fork
        self.parked: dict[int, Sequence] = {}  # sequence id -> sequence parked, holding no stream
        self._admitted = 0

    def next_admission(self) -> int:
        self._admitted += 1
        return self._admitted

    def add(self, seq: Sequence) -> None:
        seq.request.sequences.append(seq)
        (self.waiting if seq.state is State.WAITING else self.live)[seq.id] = seq

    def start(self, seq: Sequence) -> None:
        """A waiting sequence was forked: it holds a stream now, and decodes."""
        del self.waiting[seq.id]
        seq.state = State.DECODING
        self.live[seq.id] = seq

    def park(self, seq: Sequence) -> None:
        """A decoding sequence gave its stream up (its cells are in ``parked_cells``)."""
        del self.live[seq.id]
        seq.state = State.PARKED
        self.parked[seq.id] = seq

    def resume(self, seq: Sequence) -> None:
        """A parked sequence holds a stream again, its cells restored: it decodes on."""
        del self.parked[seq.id]
        seq.state = State.DECODING
        seq.resumes += 1
        self.live[seq.id] = seq

    def finish(self, seq: Sequence) -> None:
        """It holds nothing more: its sampler is closed (a waiting one is dropped from its
        request: a request cancelled while its prompt goes in ends with the samples it has)."""
        if seq.state is State.WAITING:
            del self.waiting[seq.id]
            seq.request.sequences.remove(seq)
        elif seq.state is State.PARKED:  # cancelled or timed out while parked
            del self.parked[seq.id]
            if seq.parked_since is not None:
                seq.parked_s += time.perf_counter() - seq.parked_since
            seq.parked_cells, seq.parked_since = None, None
        else:
            self.live.pop(seq.id, None)
        seq.state = State.FINISHED
        seq.sampler.close()

    def forks_of(self, parent: Sequence) -> list[Sequence]:
        """The parent's request's samples that wait for its prompt."""
        return [s for s in parent.request.sequences if s.state is State.WAITING]

    def newest_request(self) -> Request:
        return max(self.requests.values(), key=lambda r: r.admitted)
