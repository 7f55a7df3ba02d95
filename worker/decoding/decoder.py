"""Continuous batching: one llama.cpp context that decodes many sequences together.

Decoding is bound by memory bandwidth: reading the weights once for K tokens costs little
more than reading them for one, so K sequences decoded together give several times the
tokens per second of one after another (llama.cpp's server slots, Ollama's
``OLLAMA_NUM_PARALLEL`` and vLLM do the same).

The data model, from the outside in:

- a **request** is one job's generation: a prompt, sampling, end rules, and ``n``, the number
  of samples wanted; it ends when all its sequences have, and is settled as one job;
- a **sequence** is one sample being generated, with its own id (never reused), its own
  sampler chain (seeded ``seed + index``), its own text, and an explicit state: prefilling
  (its prompt going in), decoding, finished with a reason. A request's first sequence
  prefills the prompt; the others are forked from it once the prompt is in (its KV stream
  copied), so the prompt is evaluated once for all ``n``;
- a **KV stream** holds one live sequence's cells; ``KvStreams`` owns them and knows which
  token prefix each holds, live or kept after its sequence ended, so a new prompt reuses the
  longest start any stream has (``kv_streams.py``).

Each :meth:`BatchDecoder.step` is planned as data (``plan.py``), decoded (one
``llama_decode`` for the decode rows, one per prompt chunk), then committed: tokens sampled,
texts appended, states advanced. Nothing is changed before a decode and undone after it.

Each sequence's sampler chain and end rules are ``Llama.create_completion``'s own (EOS, stop
strings, length, the UTF-8 hold-back), so a seeded (or greedy) job gives the same text alone,
beside others, and whether or not its prompt's start came from the cache.
"""

from __future__ import annotations

import enum
import itertools
import logging
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuq.jobs.request import GenerationParams
from worker.decoding.constraint import ConstraintBroken, SequenceConstraint
from worker.decoding.kv_streams import Copy, KvOp, KvStreams, Move, Trim
from worker.decoding.logprobs import TokenLogprob, token_logprob
from worker.decoding.plan import N_BATCH, Chunk, Live, StepPlan, plan_step
from worker.decoding.text import HELD, CompletionText
from worker.decoding.token_pieces import TokenPieces

log = logging.getLogger(__name__)

PREFILL_CHUNK_TOKENS = 64  # a prompt goes in 64 tokens at a time, at fixed boundaries (see plan.py)
# ggml's CPU flash attention tiles a stream's rows from 64 rows a pass on (GGML_FA_TILE_Q), and
# tiled rows round differently from rows computed one by one (``python -m bench invariance``):
# with it on, prompt passes stay under 64 rows so that every prompt row takes the same kernel.
FLASH_ATTN_CHUNK_TOKENS = 63
# While others decode, a prompt with at most this many tokens left goes in beside their rows
# (plan.py): a pass of its own costs most of a step (19 ms for 3 rows beside a 22 ms step of
# 4 rows here), a row beside them ~4.4 ms, so beside is cheaper for a short prompt. Only
# with flash attention and any common prefix reused: a prompt row beside others is then
# computed as in a pass of its own (measured exact at 2 to 32 prompt tokens); without flash
# attention it is not (up to 0.48 in a logit from six tokens on: a stream's one row takes
# other attention kernels than a pass of its own rows), and whole-chunk reuse needs each
# chunk in one pass.
SHORT_TAIL_TOKENS = 8
PENALTY_LAST_N = 64  # Llama's last_n_tokens_size: the window the repeat penalty looks at


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
    # How it was computed, not what it is: the same text is the same generation.
    cached_tokens: int = field(default=0, compare=False)  # prompt tokens taken from a KV stream
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
class Sampling:
    """The knobs of create_completion's sampler chain that gpuq exposes. No defaults here:
    they live once, with their reasons, in ``GenerationParams`` (gpuq/jobs/request.py)."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repeat_penalty: float
    frequency_penalty: float
    presence_penalty: float
    seed: int | None

    @classmethod
    def of(cls, params: GenerationParams) -> Sampling:
        return cls(
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            min_p=params.min_p,
            repeat_penalty=params.repeat_penalty,
            frequency_penalty=params.frequency_penalty,
            presence_penalty=params.presence_penalty,
            seed=params.seed,
        )


class DamagedModel(RuntimeError):
    """The model computed NaN or infinite numbers: its weights are damaged (a file whose
    header is fine but whose tensors are not). Its job fails; nothing non-finite is stored."""


DAMAGED_LOGITS = "the model produced non-finite logits (NaN or infinity): its weights are damaged"


class DecodeError(RuntimeError):
    """llama_decode failed for a reason other than a full KV cache: the context is unusable."""


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


class State(enum.Enum):
    PREFILLING = "prefilling"  # its prompt going in, a chunk at a time
    DECODING = "decoding"  # a token sampled each step
    FINISHED = "finished"


@dataclass(eq=False, slots=True)
class _Sequence:
    id: int
    request: _Request
    index: int
    stream: int
    sampler: Any  # llama_cpp._internals.LlamaSampler
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

    @property
    def position(self) -> int:
        """The position of the last sampled token, the one the next decode row carries."""
        return self.fed + len(self.completion) - 1


@dataclass(eq=False, slots=True)
class _Request:
    key: str
    prompt: list[int]
    n: int
    max_tokens: int
    sampling: Sampling
    stops: list[str]
    cancel: threading.Event
    deadline: float | None
    stream: bool
    admitted: int  # admission order: the newest request is the one sent back when KV runs out
    logprobs: int | None = None  # None: none wanted; k: each token's and its k best alternatives'
    echo: bool = False  # the prompt's log-probabilities too (every prompt row decoded with logits)
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    constraint: SequenceConstraint | None = None  # its first sample's; the others get copies
    cached: int = 0
    admitted_at: float = field(default_factory=time.perf_counter)
    sequences: list[_Sequence] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return len(self.sequences) == self.n and all(s.state is State.FINISHED for s in self.sequences)


class BatchDecoder:
    """Sequences of one model decoded together in one llama.cpp context of ``slots`` KV streams."""

    def __init__(
        self,
        model: Any,
        *,
        slots: int,
        n_ctx_per_seq: int,
        threads: int,
        prompt_cache: bool = True,
        chunk_tokens: int = PREFILL_CHUNK_TOKENS,
        flash_attn: bool = True,
        any_prefix: bool = False,
    ) -> None:
        import llama_cpp
        from llama_cpp._internals import LlamaContext

        self._llama = llama_cpp
        self._model = model  # llama_cpp._internals.LlamaModel, shared: weights are loaded once
        self.slots = slots
        self.n_ctx_per_seq = n_ctx_per_seq
        if flash_attn and any_prefix:
            chunk_tokens = min(chunk_tokens, FLASH_ATTN_CHUNK_TOKENS)
        self.chunk_tokens = chunk_tokens
        self._flash_attn = flash_attn
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx_per_seq * slots
        params.n_batch = params.n_ubatch = N_BATCH
        params.n_seq_max = slots
        params.kv_unified = False  # a KV stream per sequence: outputs do not depend on neighbours
        params.n_threads = params.n_threads_batch = threads
        # On by default, as llama-server has it (Llama has it off): exact on the CPU by two rules
        # (FLASH_ATTN_CHUNK_TOKENS and the throwaway rows of ``_decode_rows``).
        params.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO if flash_attn else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        params.no_perf = True
        self._ctx = LlamaContext(model=model, params=params, verbose=False)
        self._memory = llama_cpp.llama_get_memory(self._ctx.ctx)
        self._batch = llama_cpp.llama_batch_init(N_BATCH, 0, 1)
        self._n_vocab = model.n_vocab()
        self._bos = model.token_bos()
        self._pieces_of = TokenPieces(model.vocab)  # the desk's thread asks too (token_bytes)
        self.kv = KvStreams(slots, chunk_tokens=chunk_tokens, reuse=prompt_cache, any_prefix=any_prefix)
        self._requests: dict[str, _Request] = {}
        self._live: dict[int, _Sequence] = {}  # sequence id -> sequence, prefilling or decoding
        self._ids = itertools.count()
        self._admitted = 0
        self._reserved = 0  # streams held for the forks of requests still prefilling
        self.last_plan: StepPlan | None = None  # what the last step decoded
        # Streams the next step frees for sure: sequences whose next token is their last by
        # length. Set by the engine's thread after each step, read by the desk's, which takes
        # jobs for them while that step runs, so that they go in at the step after it.
        self.freed_next_step = 0
        self.tokens_decoded = 0  # every token any llama_decode of this context took: the shares of energy
        self.reused_tokens = 0  # prompt tokens taken from a KV stream instead of decoded
        self.decode_seconds = 0.0  # inside llama_decode: the rest of a step is the engine's own cost
        self._pieces: list[Piece] = []  # streaming sequences' text since take_pieces

    def close(self) -> None:
        for seq in self._live.values():
            seq.sampler.close()
        self._live.clear()
        self._requests.clear()
        if self._batch is not None:
            self._llama.llama_batch_free(self._batch)
            self._batch = None
        self._ctx.close()

    @property
    def free_slots(self) -> int:
        """KV streams free for new sequences (a request of ``n`` samples needs ``n``)."""
        return self.kv.free - self._reserved

    @property
    def active(self) -> int:
        """Requests admitted and not yet ended."""
        return len(self._requests)

    def live_keys(self) -> list[str]:
        """The keys of the requests admitted and not yet ended."""
        return list(self._requests)

    def abandon(self) -> None:
        """Drops every request without an ending (decoding failed: the context is unusable)."""
        for request in list(self._requests.values()):
            self._fail(request, "abandoned")

    def live_slots(self) -> list[int]:
        """The KV streams live sequences hold."""
        return sorted(seq.stream for seq in self._live.values())

    def admit(
        self,
        key: str,
        prompt: list[int],
        *,
        max_tokens: int,
        sampling: Sampling,
        stop: Iterable[str] = (),
        cancel: threading.Event | None = None,
        deadline: float | None = None,
        stream: bool = False,
        n: int = 1,
        logprobs: int | None = None,
        echo: bool = False,
        constraint: SequenceConstraint | None = None,
    ) -> int:
        """Adds a request; its prompt goes in from the next step. Needs ``n`` free slots.
        Returns how many prompt tokens it takes from the cache. A ``stream`` request's text is
        also handed out piece by piece (``take_pieces``). ``logprobs``: each sampled token's
        log-probability and its ``logprobs`` best alternatives; with ``echo`` the prompt's
        too, so its prompt is decoded whole (no cache: reused cells have no logits). A
        ``constraint`` masks each of its samples' logits to what its grammar allows."""
        if not prompt:
            raise ValueError("the prompt has no tokens")
        if len(prompt) >= self.n_ctx_per_seq:
            raise ValueError(f"the prompt has {len(prompt)} tokens; this model's context holds {self.n_ctx_per_seq}")
        if n < 1 or n > self.free_slots:
            raise ValueError(f"a request of {n} samples needs {n} free slots; {self.free_slots} are free")
        if key in self._requests:
            raise ValueError(f"{key} is already decoding here")
        # create_completion's rule: the completion is cut where the context ends.
        if max_tokens <= 0 or max_tokens + len(prompt) >= self.n_ctx_per_seq:
            max_tokens = self.n_ctx_per_seq - len(prompt)
        self._admitted += 1
        request = _Request(
            key=key,
            prompt=list(prompt),
            n=n,
            max_tokens=max_tokens,
            sampling=sampling,
            stops=[s for s in stop if s],
            cancel=cancel or threading.Event(),
            deadline=deadline,
            stream=stream,
            admitted=self._admitted,
            logprobs=logprobs,
            echo=echo and logprobs is not None,
            constraint=constraint,
        )
        if request.echo:
            request.prompt_logprobs = [TokenLogprob(request.prompt[0], None)]
        seq_id = next(self._ids)
        placement = self.kv.place(seq_id, request.prompt, reuse=not request.echo)
        self._apply(placement.ops)
        request.cached = placement.reused
        self.reused_tokens += placement.reused
        seq = self._sequence(seq_id, request, 0, placement.stream)
        seq.fed = placement.reused
        self._reserved += n - 1
        self._requests[key] = request
        return placement.reused

    def take_pieces(self) -> list[Piece]:
        """The streaming sequences' text produced since the last call, in order."""
        pieces, self._pieces = self._pieces, []
        return pieces

    def step(self) -> list[Finished]:
        """One step for every live sequence; returns the requests that ended."""
        finished = self._cut_off()
        if self._live:
            self._move_down()
            self._order_waiting()
            plan = plan_step(
                self._views(),
                chunk_tokens=self.chunk_tokens,
                aligned=not self.kv.any_prefix,
                short_tail=SHORT_TAIL_TOKENS if self._flash_attn and self.kv.any_prefix else 0,
            )
            finished += self._run(plan)
            self.last_plan = plan
        self.freed_next_step = sum(
            1
            for seq in self._live.values()
            if seq.state is State.DECODING and len(seq.completion) + 1 >= seq.request.max_tokens
        )
        return finished

    # ------------------------------------------------------------- plan, decode, commit

    def _views(self) -> list[Live]:
        return [
            Live(
                id=seq.id,
                stream=seq.stream,
                admitted=seq.request.admitted,
                prompt_len=len(seq.request.prompt),
                fed=seq.fed,
                pending=seq.completion[-1] if seq.state is State.DECODING else None,
                position=seq.position,
                prompt_logits=seq.request.echo,
            )
            for seq in self._live.values()
        ]

    def _run(self, plan: StepPlan) -> list[Finished]:
        finished: list[Finished] = []
        if plan.rows:
            code, places, beside_places = self._decode_rows(plan)
            if code == 1:
                return [self._evict_newest()]
            for i, row in zip(places, plan.rows, strict=True):
                seq = self._live.get(row.sequence)
                if seq is not None:  # its request may have ended at an earlier row (damaged logits)
                    finished += self._sample(seq, i)
            for i, chunk in zip(beside_places, plan.beside, strict=True):
                seq = self._live.get(chunk.sequence)
                if seq is not None:
                    finished += self._commit_chunk(seq, chunk, last_row=i, beside=True)
        for chunk in plan.chunks:
            seq = self._live.get(chunk.sequence)
            if seq is None:
                continue
            prompt = seq.request.prompt
            code = self._decode(
                [(prompt[p], p, chunk.stream, chunk.wants_logits(p)) for p in range(chunk.start, chunk.end)]
            )
            if code == 1:
                return [*finished, self._evict_newest()]
            finished += self._commit_chunk(seq, chunk, last_row=chunk.end - chunk.start - 1)
        return finished

    def _decode_rows(self, plan: StepPlan) -> tuple[int, list[int], list[int]]:
        """The step's decode rows, and the prompt rows beside them, in one llama_decode;
        returns llama_decode's code and each plan row's and beside chunk's place in the batch.

        With flash attention, ggml's CPU kernel splits the KV of a pass that holds one row of
        one stream over its threads (from 512 cells on), which rounds otherwise than the same
        row beside other streams' rows. llama.cpp makes a micro-batch of consecutive streams
        only, so a lone row, or rows with a stream between them that does not decode (it is
        prefilling), would each be such a pass. So the rows' streams are made one unbroken run
        of two or more: a throwaway row goes into each stream missing from it (after its last
        cell, removed once decoded), and a sequence's logits are the same alone as beside others."""
        rows = {r.stream: (r.token, r.position, r.stream, True) for r in plan.rows}
        for c in plan.beside:
            rows[c.stream] = (self._live[c.sequence].request.prompt[c.start], c.start, c.stream, c.last)
        throwaway: dict[int, int] = {}  # stream -> the position of its throwaway row
        if self._flash_attn and self.slots > 1:
            low, high = min(rows), max(rows)
            if low == high:
                low, high = (low, low + 1) if low + 1 < self.slots else (low - 1, low)
            for stream in range(low, high + 1):
                position = int(self._llama.llama_memory_seq_pos_max(self._memory, stream)) + 1
                if stream not in rows and position < self.n_ctx_per_seq:
                    throwaway[stream] = position
        extra = [(self._bos, position, stream, False) for stream, position in throwaway.items()]
        batch = sorted([*rows.values(), *extra], key=lambda row: row[2])
        code = self._decode(batch, counted=len(rows))
        if code == 0:
            for stream, position in throwaway.items():
                self._llama.llama_memory_seq_rm(self._memory, stream, position, -1)
        place = {row[2]: i for i, row in enumerate(batch)}
        return code, [place[r.stream] for r in plan.rows], [place[c.stream] for c in plan.beside]

    def _decode(self, rows: list[tuple[int, int, int, bool]], *, counted: int | None = None) -> int:
        """One llama_decode of (token, position, stream, wants logits) rows. 1: no KV room
        (llama.cpp left the cache as it was). ``counted``: the rows that are a sequence's (the
        shares of energy), if not all."""
        batch = self._batch
        for i, (token, pos, stream, logits) in enumerate(rows):
            batch.token[i] = token
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = stream
            batch.logits[i] = logits
        batch.n_tokens = len(rows)
        started = time.perf_counter()
        code = int(self._llama.llama_decode(self._ctx.ctx, batch))
        self.decode_seconds += time.perf_counter() - started
        if code not in (0, 1):
            raise DecodeError(f"llama_decode returned {code}")
        if code == 0:
            self.tokens_decoded += len(rows) if counted is None else counted
        return code

    def _commit_chunk(self, seq: _Sequence, chunk: Chunk, *, last_row: int, beside: bool = False) -> list[Finished]:
        """The chunk's KV is in; ``last_row``: its last row's place in its batch (beside: among
        the decode rows, a pass of two rows or more)."""
        request = seq.request
        rows = chunk.end - chunk.start
        if rows == self.chunk_tokens or (self.kv.any_prefix and (rows >= 2 or beside)):  # reusable by later prompts
            self.kv.computed(seq.stream, request.prompt[chunk.start : chunk.end])
        seq.fed = chunk.end
        if request.echo:
            self._prompt_logprobs(request, chunk)
        if not chunk.last:
            return []
        seqs = [seq, *self._fork(seq)]
        for each in seqs:
            each.state = State.DECODING
        out: list[Finished] = []
        for each in seqs:
            if each.id in self._live:
                out += self._sample(each, last_row)
        return out

    def _fork(self, parent: _Sequence) -> list[_Sequence]:
        """The request's other samples, each a copy of the parent's KV stream with its own
        sampler, once the prompt is in: the prompt is evaluated once for all of them."""
        request = parent.request
        children = []
        for index in range(1, request.n):
            seq_id = next(self._ids)
            placement = self.kv.fork(parent.stream, seq_id)
            self._apply(placement.ops)
            child = self._sequence(seq_id, request, index, placement.stream)
            child.fed = parent.fed
            children.append(child)
        self._reserved -= request.n - 1
        return children

    def _sample(self, seq: _Sequence, row: int) -> list[Finished]:
        """create_completion's loop body for one token: EOS, stop strings, length."""
        request = seq.request
        if not self._logits_finite(row):
            return [self._fail(request, DAMAGED_LOGITS)]
        try:
            token = self._draw(seq, row)
        except ConstraintBroken as exc:
            return [self._fail(request, str(exc))]
        if seq.first_token_at is None:
            seq.first_token_at = time.perf_counter()
        if token is None or self._llama.llama_vocab_is_eog(self._model.vocab, token):
            return self._end(seq, "stop")
        seq.completion.append(token)
        seq.unsent_tokens += 1
        if request.logprobs is not None:
            seq.logprobs.append(token_logprob(self._logits(row), token, request.logprobs))
            seq.starts.append(len(seq.text.data))
        cut = seq.text.append(self._piece(token, first=len(seq.completion) == 1))
        if cut == HELD:
            return []
        if cut is not None:
            seq.cut = cut
            return self._end(seq, "stop")
        if len(seq.completion) >= request.max_tokens:
            return self._end(seq, "length")
        if request.stream:
            self._hand_out(seq, seq.text.sendable())
        return []

    def _draw(self, seq: _Sequence, row: int) -> int | None:
        """The sequence's next token from its sampler chain; with a constraint, drawn among
        the tokens its grammar allows, and None once the grammar is complete (nothing may
        follow: the sequence ends as at end-of-text)."""
        constraint = seq.constraint
        if constraint is None:
            return int(self._llama.llama_sampler_sample(seq.sampler.sampler, self._ctx.ctx, row))
        if constraint.complete:
            return None
        with constraint.masked(self._logits(row)):
            token = int(self._llama.llama_sampler_sample(seq.sampler.sampler, self._ctx.ctx, row))
        constraint.consume(token)
        return token

    def _piece(self, token: int, *, first: bool) -> bytes:
        """A token's bytes, as ``LlamaModel.detokenize`` gives them (which drops the leading
        space of a BOS token that starts the text)."""
        piece = self._pieces_of(token)
        return piece[1:] if first and token == self._bos and piece[:1] == b" " else piece

    def _logits(self, row: int) -> np.ndarray:
        """The row's logits in llama.cpp's own buffer, valid until the next decode (writing
        them changes what is sampled)."""
        logits = self._llama.llama_get_logits_ith(self._ctx.ctx, row)
        return np.ctypeslib.as_array(logits, shape=(self._n_vocab,))

    def _logits_finite(self, row: int) -> bool:
        """NaN logits would still sample some token (often end-of-text): an empty "success"."""
        return bool(np.isfinite(self._logits(row)).all())

    def _prompt_logprobs(self, request: _Request, chunk: Chunk) -> None:
        """Each row of the chunk gives the next prompt token's log-probability (the prompt's
        last row gives the first sampled token's, in ``_sample``)."""
        prompt, top = request.prompt, request.logprobs or 0
        for row, position in enumerate(range(chunk.start, min(chunk.end, len(prompt) - 1))):
            request.prompt_logprobs.append(token_logprob(self._logits(row), prompt[position + 1], top))

    def token_bytes(self, token: int) -> bytes:
        """A token's bytes, as the vocabulary has them (safe from the desk's thread)."""
        return self._pieces_of(token)

    # ------------------------------------------------------------- endings

    def _end(self, seq: _Sequence, reason: str) -> list[Finished]:
        seq.finish_reason = reason
        self._leave(seq)
        request = seq.request
        if request.stream:
            self._hand_out(seq, len(self._text_bytes(seq)), final=True)
        if not request.finished:
            return []
        del self._requests[request.key]
        return [Finished(request.key, tuple(self._generation(s) for s in request.sequences))]

    def _leave(self, seq: _Sequence) -> None:
        seq.state = State.FINISHED
        seq.sampler.close()
        self._live.pop(seq.id, None)
        self.kv.release(seq.stream)

    def _cut_off(self) -> list[Finished]:
        """Requests cancelled or past their deadline leave before the step; the others go on."""
        out = []
        now = time.monotonic()
        for request in list(self._requests.values()):
            if request.cancel.is_set():
                for seq in self._unfinished(request):
                    out += self._end(seq, "cancelled")
            elif request.deadline is not None and now >= request.deadline:
                out.append(self._fail(request, "timed out (GPUQ_JOB_TIMEOUT_S)"))
        return out

    def _unfinished(self, request: _Request) -> list[_Sequence]:
        """Its live sequences; the forks it has not made yet are not made (a request cancelled
        while its prompt goes in ends with the one sample it has)."""
        live = [s for s in request.sequences if s.state is not State.FINISHED]
        if len(request.sequences) < request.n:
            self._reserved -= request.n - len(request.sequences)
            request.n = len(request.sequences)
        return live

    def _fail(self, request: _Request, error: str) -> Finished:
        self._unfinished(request)
        for seq in request.sequences:
            if seq.state is not State.FINISHED:
                self._leave(seq)
        del self._requests[request.key]
        return Finished(request.key, error=error)

    def _evict_newest(self) -> Finished:
        """No KV room for this step: the newest request goes back to its queue (llama.cpp left
        the cache as it was, and nothing was committed, so the others simply step again)."""
        newest = max(self._requests.values(), key=lambda r: r.admitted)
        log.warning("no KV cache room for %d requests; sending %s back", len(self._requests), newest.key)
        finished = self._fail(newest, "no KV cache room")
        return Finished(finished.key, evicted=True)

    def _generation(self, seq: _Sequence) -> Generation:
        request = seq.request
        now = time.perf_counter()
        first = seq.first_token_at
        logprobs = None
        if request.logprobs is not None:
            kept = len(seq.logprobs) if seq.cut is None else sum(1 for at in seq.starts if at < seq.cut)
            logprobs = tuple(seq.logprobs[:kept])
        return Generation(
            text=self._text_bytes(seq).decode("utf-8", errors="ignore"),
            finish_reason=seq.finish_reason or "stop",
            prompt_tokens=len(request.prompt),
            completion_tokens=len(seq.completion),
            token_ids=tuple(seq.completion),
            index=seq.index,
            logprobs=logprobs,
            prompt_logprobs=tuple(request.prompt_logprobs) if request.echo else None,
            cached_tokens=request.cached,
            prompt_ms=int((first - request.admitted_at) * 1000) if first is not None else None,
            eval_ms=int((now - first) * 1000) if first is not None else None,
        )

    @staticmethod
    def _text_bytes(seq: _Sequence) -> bytes:
        data = seq.text.data
        return bytes(data[: seq.cut] if seq.cut is not None else data)

    def _hand_out(self, seq: _Sequence, upto: int, *, final: bool = False) -> None:
        chunk = seq.text.take(upto, final=final)
        if chunk or (final and seq.unsent_tokens):
            covered = seq.logprobs[len(seq.logprobs) - seq.unsent_tokens :] if seq.request.logprobs is not None else []
            self._pieces.append(Piece(seq.request.key, chunk, seq.unsent_tokens, seq.index, tuple(covered)))
            seq.unsent_tokens = 0

    # ------------------------------------------------------------- streams and samplers

    def _sequence(self, seq_id: int, request: _Request, index: int, stream: int) -> _Sequence:
        seq = _Sequence(
            id=seq_id,
            request=request,
            index=index,
            stream=stream,
            sampler=self._sampler(request.sampling, index),
            text=CompletionText.with_stops(request.stops),
            constraint=request.constraint if index == 0 or request.constraint is None else request.constraint.fork(),
        )
        request.sequences.append(seq)
        self._live[seq_id] = seq
        return seq

    def _move_down(self) -> None:
        """Decoding sequences move down into free streams below them (``KvStreams.moves``)."""
        decoding = {seq.stream for seq in self._live.values() if seq.state is State.DECODING}
        self._relocate(*self.kv.moves(decoding))

    def _order_waiting(self) -> None:
        """Prompts not yet begun (nothing in their streams) take the lowest streams they can,
        their own or free ones, oldest first (``KvStreams.order_waiting``). The prompt that goes
        in beside the decode rows next (lowest stream first, plan.py) is then the one that
        waited longest, never one that came after it into a stream just freed; and it lies
        next to the decode rows, where a row in a stream far above them would take a throwaway
        row in each stream between (``_decode_rows``), and once it decodes, a copy down."""
        waiting = sorted(
            (s for s in self._live.values() if s.state is State.PREFILLING and s.fed == 0),
            key=lambda s: s.request.admitted,
        )
        self._relocate(*self.kv.order_waiting([s.stream for s in waiting]))

    def _relocate(self, moves: list[Move], ops: tuple[KvOp, ...]) -> None:
        """Sequences into the streams ``KvStreams`` moved them to, after its operations."""
        self._apply(ops)
        for move in moves:
            self._live[move.sequence].stream = move.dst

    def _apply(self, ops: Iterable[KvOp]) -> None:
        for op in ops:
            if isinstance(op, Copy):
                # Whole streams: llama.cpp copies the buffers at the next decode, in order.
                self._llama.llama_memory_seq_cp(self._memory, op.src, op.dst, -1, -1)
            elif isinstance(op, Trim):
                self._llama.llama_memory_seq_rm(self._memory, op.stream, op.keep, -1)

    def _sampler(self, sampling: Sampling, index: int) -> Any:
        """The chain create_completion builds (Llama._init_sampler), per sequence; the i-th
        sample of a seeded request is seeded ``seed + i``."""
        from llama_cpp._internals import LlamaSampler

        seed = (sampling.seed + index) % 2**32 if sampling.seed is not None else secrets.randbelow(2**32)
        sampler = LlamaSampler()
        sampler.add_penalties(
            self._n_vocab,
            PENALTY_LAST_N,
            sampling.repeat_penalty,
            sampling.frequency_penalty,
            sampling.presence_penalty,
        )
        if sampling.temperature < 0:
            sampler.add_dist(seed)
        elif sampling.temperature == 0:
            sampler.add_greedy()
        else:
            sampler.add_top_k(sampling.top_k)
            sampler.add_typical(1.0, 1)
            sampler.add_top_p(sampling.top_p, 1)
            sampler.add_min_p(sampling.min_p, 1)
            sampler.add_temp(sampling.temperature)
            sampler.add_dist(seed)
        return sampler
