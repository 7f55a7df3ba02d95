"""Continuous batching: one llama.cpp context that decodes up to K sequences together.

Decoding is bound by memory bandwidth: reading the weights once for K tokens costs little
more than reading them for one, so K sequences decoded together give several times the
tokens per second of one after another (llama.cpp's server slots, Ollama's
``OLLAMA_NUM_PARALLEL`` and vLLM do the same). Each :meth:`BatchDecoder.step` is one
``llama_decode`` holding the next token of every generating sequence plus a bounded chunk
of the prompts admitted since, so a long prompt never stalls the others for long. A
sequence joins when a slot is free and leaves when it ends; its KV cells are removed and
its slot reused at once.

Each sequence has its own KV stream (``kv_unified=False``) and its own sampler chain, the
chain ``Llama.create_completion`` builds, with the same stop-string and length rules, so a
seeded (or greedy) job gives the same text whether it ran alone or beside others.
"""

from __future__ import annotations

import codecs
import logging
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

N_BATCH = 512  # tokens per llama_decode at most, as Llama's default
PREFILL_CHUNK_TOKENS = 64  # prompt tokens per step while other sequences generate
PENALTY_LAST_N = 64  # Llama's last_n_tokens_size: the window the repeat penalty looks at


@dataclass(frozen=True, slots=True)
class Generation:
    text: str
    finish_reason: str  # "stop", "length" or "cancelled"
    prompt_tokens: int
    completion_tokens: int
    # Timings (not part of what a generation is: the same text is the same generation).
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


@dataclass(frozen=True, slots=True)
class Sampling:
    """The knobs of create_completion's sampler chain that gpuq exposes, with its defaults."""

    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None

    @classmethod
    def of(cls, request: dict[str, Any]) -> Sampling:
        defaults = cls()
        return cls(
            temperature=request.get("temperature", defaults.temperature),
            top_p=request.get("top_p", defaults.top_p),
            top_k=request.get("top_k") or defaults.top_k,
            min_p=request.get("min_p", defaults.min_p),
            repeat_penalty=request.get("repeat_penalty") or defaults.repeat_penalty,
            frequency_penalty=request.get("frequency_penalty") or defaults.frequency_penalty,
            presence_penalty=request.get("presence_penalty") or defaults.presence_penalty,
            seed=request.get("seed"),
        )


class DamagedModel(RuntimeError):
    """The model computed NaN or infinite numbers: its weights are damaged (a file whose
    header is fine but whose tensors are not). Its job fails; nothing non-finite is stored."""


DAMAGED_LOGITS = "the model produced non-finite logits (NaN or infinity): its weights are damaged"


class DecodeError(RuntimeError):
    """llama_decode failed for a reason other than a full KV cache: the context is unusable."""


@dataclass(eq=False)
class _Sequence:
    key: str
    slot: int
    prompt: list[int]
    max_tokens: int
    stop: list[bytes]
    sampler: Any  # llama_cpp._internals.LlamaSampler
    cancel: threading.Event
    deadline: float | None  # time.monotonic() past which the job is cut off
    admitted: int  # admission order: the newest sequence is the one sent back when KV runs out
    fed: int = 0  # prompt tokens already decoded (or found in the slot's cache)
    decoded: int = 0  # positions whose KV cells hold this sequence's tokens
    completion: list[int] = field(default_factory=list)
    multibyte_fix: int = 0
    logits_at: int = -1  # index in this step's batch whose logits to sample, -1 if none
    admitted_at: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    # Streaming: bytes of the text already sent as pieces, and tokens not yet covered by one.
    stream: bool = False
    sent: int = 0
    unsent_tokens: int = 0
    utf8: codecs.IncrementalDecoder = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("ignore"))

    @property
    def generating(self) -> bool:
        return self.fed == len(self.prompt)

    @property
    def n_past(self) -> int:
        return self.fed + max(0, len(self.completion) - 1)


@dataclass(frozen=True, slots=True)
class Finished:
    """A sequence that left the decoder: its generation, or why it has none."""

    key: str
    generation: Generation | None = None
    error: str | None = None  # the job failed (a deadline passed)
    evicted: bool = False  # no KV room: the job should go back to its queue


class BatchDecoder:
    """Up to ``slots`` sequences of one model, decoded together in one llama.cpp context."""

    def __init__(self, model: Any, *, slots: int, n_ctx_per_seq: int, threads: int, prompt_cache: bool = False) -> None:
        import llama_cpp
        from llama_cpp._internals import LlamaContext

        self._llama = llama_cpp
        self._model = model  # llama_cpp._internals.LlamaModel, shared: weights are loaded once
        self.slots = slots
        self.n_ctx_per_seq = n_ctx_per_seq
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx_per_seq * slots
        params.n_batch = params.n_ubatch = N_BATCH
        params.n_seq_max = slots
        params.kv_unified = False  # a KV stream per sequence: outputs do not depend on neighbours
        params.n_threads = params.n_threads_batch = threads
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED  # as Llama's default
        params.no_perf = True
        self._ctx = LlamaContext(model=model, params=params, verbose=False)
        self._memory = llama_cpp.llama_get_memory(self._ctx.ctx)
        self._batch = llama_cpp.llama_batch_init(N_BATCH, 0, 1)
        self._n_vocab = model.n_vocab()
        self._running: dict[int, _Sequence] = {}
        self._admitted = 0
        self.last_step = (0, 0)  # (sequences that got a token, prompt tokens fed) in the last decode
        self.tokens_decoded = 0  # every token any llama_decode of this context took: the shares of energy
        self._pieces: list[Piece] = []  # streaming sequences' text since take_pieces
        # Prompt cache (GPUQ_WORKER_PROMPT_CACHE): per free slot, the tokens whose KV cells its
        # last sequence left there. Off by default: a prompt's last tokens decoded apart from
        # its cached start give logits that differ in the last bits, so a seeded job could give
        # another text than it gives alone (greedy ones very rarely); with it off, it never does.
        self.prompt_cache = prompt_cache
        self._cached: dict[int, list[int]] = {}
        self.reused_tokens = 0  # prompt tokens found in a slot's cache instead of decoded

    def close(self) -> None:
        for seq in self._running.values():
            seq.sampler.close()
        self._running.clear()
        if self._batch is not None:
            self._llama.llama_batch_free(self._batch)
            self._batch = None
        self._ctx.close()

    @property
    def free_slots(self) -> int:
        return self.slots - len(self._running)

    @property
    def active(self) -> int:
        return len(self._running)

    def running_keys(self) -> list[str]:
        return [seq.key for seq in self._running.values()]

    def live_slots(self) -> list[int]:
        return sorted(self._running)

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
    ) -> None:
        """Add a sequence; it starts with its prompt at the next step. Needs a free slot.
        A ``stream`` sequence's text is also handed out piece by piece (``take_pieces``)."""
        if not prompt:
            raise ValueError("the prompt has no tokens")
        if len(prompt) >= self.n_ctx_per_seq:
            raise ValueError(f"the prompt has {len(prompt)} tokens; this model's context holds {self.n_ctx_per_seq}")
        slot, reused = self._slot_for(prompt)  # StopIteration: no free slot
        # create_completion's rule: the completion is cut where the context ends.
        if max_tokens <= 0 or max_tokens + len(prompt) >= self.n_ctx_per_seq:
            max_tokens = self.n_ctx_per_seq - len(prompt)
        self._admitted += 1
        self.reused_tokens += reused
        self._running[slot] = _Sequence(
            key=key,
            slot=slot,
            prompt=list(prompt),
            max_tokens=max_tokens,
            stop=[s.encode("utf-8") for s in stop if s],
            sampler=self._sampler(sampling),
            cancel=cancel or threading.Event(),
            deadline=deadline,
            admitted=self._admitted,
            stream=stream,
            fed=reused,
            decoded=reused,
        )

    def _slot_for(self, prompt: list[int]) -> tuple[int, int]:
        """A free slot, the one whose cached tokens share the longest start with the prompt (as
        llama.cpp's server and llama-cpp-python's ``Llama`` reuse a prompt's cached prefix: a
        chat template's system prompt, a conversation's earlier turns), and how many prompt
        tokens it already holds. At least the last prompt token is decoded again, for its logits."""
        free = [s for s in range(self.slots) if s not in self._running]
        if not self.prompt_cache:
            return free[0], 0
        shared = {s: _common_prefix(self._cached.get(s, []), prompt) for s in free}
        # Sharing nothing, an empty slot is taken first, so the caches of the others are kept.
        slot = max(free, key=lambda s: (shared[s], s not in self._cached))
        reused = min(shared[slot], len(prompt) - 1)
        self._cached.pop(slot, None)
        if not self._llama.llama_memory_seq_rm(self._memory, slot, reused, -1):
            self._llama.llama_memory_seq_rm(self._memory, slot, -1, -1)  # a cache that cannot be cut: none
            reused = 0
        return slot, reused

    def take_pieces(self) -> list[Piece]:
        """The streaming sequences' text produced since the last call, in order."""
        pieces, self._pieces = self._pieces, []
        return pieces

    def step(self) -> list[Finished]:
        """One llama_decode for every running sequence; returns those that ended."""
        finished = self._cut_off()
        if not self._running:
            return finished
        self._close_gaps()
        fed_before = {seq.slot: seq.fed for seq in self._running.values()}
        batch = self._fill_batch()
        code = self._llama.llama_decode(self._ctx.ctx, batch)
        if code == 1:
            # No KV room for this batch (llama.cpp left the cache as it was): the newest
            # sequence goes back to its queue, the others redo this step's tokens next time.
            newest = max(self._running.values(), key=lambda s: s.admitted)
            log.warning("no KV cache room for %d sequences; sending %s back", len(self._running), newest.key)
            self._remove(newest, keep_cache=False)
            for seq in self._running.values():
                seq.fed, seq.logits_at = fed_before[seq.slot], -1
            return [*finished, Finished(newest.key, evicted=True)]
        if code != 0:
            raise DecodeError(f"llama_decode returned {code}")
        self.tokens_decoded += batch.n_tokens
        for seq in self._running.values():  # before sampling appends this step's tokens
            seq.decoded = seq.fed + len(seq.completion)
        for seq in list(self._running.values()):
            if seq.logits_at >= 0:
                done = self._sample(seq)
                if done is not None:
                    finished.append(done)
        return finished

    # ------------------------------------------------------------- internals

    def _sampler(self, sampling: Sampling) -> Any:
        """The chain create_completion builds (Llama._init_sampler), per sequence."""
        from llama_cpp._internals import LlamaSampler

        seed = sampling.seed if sampling.seed is not None else secrets.randbelow(2**32)
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

    def _cut_off(self) -> list[Finished]:
        """Sequences cancelled or past their deadline leave before the step; the others go on."""
        out = []
        now = time.monotonic()
        for seq in list(self._running.values()):
            if seq.cancel.is_set():
                self._remove(seq)
                out.append(Finished(seq.key, self._generation(seq, "cancelled")))
            elif seq.deadline is not None and now >= seq.deadline:
                self._remove(seq)
                out.append(Finished(seq.key, error="timed out (GPUQ_JOB_TIMEOUT_S)"))
        return out

    def _close_gaps(self) -> None:
        """While a free slot lies below a live one, the sequence in the highest slot moves down
        into the lowest free one, so the live slots are 0..n-1 and a step is one micro-batch
        (see ``_fill_batch``): without it, live slots 0, 2 and 5 (jobs that ended with nothing
        waiting to take their slots) would take three passes over the weights every step. The
        move copies the KV stream whole, exactly (same text, tested), once: on the CPU 45 MiB
        for the bundled model, a fraction of one step. Not with the prompt cache, whose point
        is what the free slots hold."""
        if self.prompt_cache:
            return
        while True:
            free = [s for s in range(self.slots) if s not in self._running]
            top = max(self._running)
            if not free or free[0] > top:
                return
            seq = self._running.pop(top)
            self._llama.llama_memory_seq_cp(self._memory, top, free[0], -1, -1)
            self._llama.llama_memory_seq_rm(self._memory, top, -1, -1)
            seq.slot = free[0]
            self._running[seq.slot] = seq

    def _fill_batch(self) -> Any:
        """This step's rows: the token each generating sequence sampled last, and chunks of
        the new prompts, oldest admission first, within the budget.

        Rows go in slot order. With a KV stream per sequence, llama.cpp puts only consecutive
        sequence ids in one micro-batch: rows out of order (a slot reused after its neighbours
        ended) would split a step into several passes over the weights. Measured on the
        bundled model at K=8: 31 ms a step in slot order, 36-44 ms out of order."""
        batch = self._batch
        generating = [s for s in self._running.values() if s.generating and s.completion]
        # New prompts fill what is left, bounded while others generate so they are not stalled.
        budget = N_BATCH - len(generating) if not generating else PREFILL_CHUNK_TOKENS
        chunks: dict[int, range] = {}
        for seq in sorted(self._running.values(), key=lambda s: s.admitted):
            take = min(len(seq.prompt) - seq.fed, budget)
            if not seq.generating and take > 0:
                chunks[seq.slot] = range(seq.fed, seq.fed + take)
                budget -= take
        n = 0
        for seq in sorted(self._running.values(), key=lambda s: s.slot):
            seq.logits_at = -1
            if seq in generating:
                self._put(batch, n, seq.completion[-1], seq.n_past, seq.slot, logits=True)
                seq.logits_at = n
                n += 1
            for pos in chunks.get(seq.slot, ()):
                last = pos == len(seq.prompt) - 1
                self._put(batch, n, seq.prompt[pos], pos, seq.slot, logits=last)
                if last:
                    seq.logits_at = n
                n += 1
                seq.fed += 1
        batch.n_tokens = n
        self.last_step = (len(generating), n - len(generating))
        return batch

    @staticmethod
    def _put(batch: Any, i: int, token: int, pos: int, seq_id: int, *, logits: bool) -> None:
        batch.token[i] = token
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq_id
        batch.logits[i] = logits

    def _logits_finite(self, seq: _Sequence) -> bool:
        """NaN logits would still sample some token (often end-of-text): an empty "success"."""
        logits = self._llama.llama_get_logits_ith(self._ctx.ctx, seq.logits_at)
        return bool(np.isfinite(np.ctypeslib.as_array(logits, shape=(self._n_vocab,))).all())

    def _sample(self, seq: _Sequence) -> Finished | None:
        """create_completion's loop body for one token: EOS, stop strings, length."""
        if not self._logits_finite(seq):
            self._remove(seq)
            return Finished(seq.key, error=DAMAGED_LOGITS)
        token = self._llama.llama_sampler_sample(seq.sampler.sampler, self._ctx.ctx, seq.logits_at)
        seq.logits_at = -1
        if seq.first_token_at is None:
            seq.first_token_at = time.perf_counter()
        if self._llama.llama_vocab_is_eog(self._model.vocab, token):
            return self._end(seq, "stop")
        seq.completion.append(token)
        seq.unsent_tokens += 1
        text = self._model.detokenize(seq.completion)
        # As create_completion: hold the checks while the text ends inside a UTF-8 character.
        seq.multibyte_fix = _utf8_tokens_missing(text) or seq.multibyte_fix
        if seq.multibyte_fix > 0:
            seq.multibyte_fix -= 1
            return None
        stops = [s for s in seq.stop if s in text]
        if stops:
            return self._end(seq, "stop", text[: text.index(stops[0])])
        if len(seq.completion) >= seq.max_tokens:
            return self._end(seq, "length", text)
        if seq.stream:
            self._piece(seq, text, len(text) - _stop_prefix(text, seq.stop))
        return None

    def _end(self, seq: _Sequence, reason: str, text: bytes | None = None) -> Finished:
        self._remove(seq)
        return Finished(seq.key, self._generation(seq, reason, text))

    def _generation(self, seq: _Sequence, reason: str, text: bytes | None = None) -> Generation:
        if text is None:
            text = self._model.detokenize(seq.completion)
        if seq.stream:
            self._piece(seq, text, len(text), final=True)
        now = time.perf_counter()
        first = seq.first_token_at
        return Generation(
            text=text.decode("utf-8", errors="ignore"),
            finish_reason=reason,
            prompt_tokens=len(seq.prompt),
            completion_tokens=len(seq.completion),
            prompt_ms=int((first - seq.admitted_at) * 1000) if first is not None else None,
            eval_ms=int((now - first) * 1000) if first is not None else None,
        )

    def _piece(self, seq: _Sequence, text: bytes, upto: int, *, final: bool = False) -> None:
        """Hands out the text from what was sent up to ``upto`` (bytes), decoded incrementally:
        the pieces' concatenation is the final text's own decoding."""
        if upto < seq.sent:  # cannot happen: held-back text is the only text a stop string may cut
            log.warning("sequence %s: %d bytes were streamed past its end", seq.key, seq.sent - upto)
            upto = seq.sent
        chunk = seq.utf8.decode(text[seq.sent : upto], final=final)
        seq.sent = upto
        if chunk or (final and seq.unsent_tokens):
            self._pieces.append(Piece(seq.key, chunk, seq.unsent_tokens))
            seq.unsent_tokens = 0

    def _remove(self, seq: _Sequence, *, keep_cache: bool = True) -> None:
        """Frees the slot at once, and its KV cells; with the prompt cache they stay as the
        slot's cache instead (each sequence has its own KV stream, so they take no room from
        the others), and the next sequence there keeps what it shares with them."""
        if keep_cache and self.prompt_cache:
            self._cached[seq.slot] = (seq.prompt + seq.completion)[: seq.decoded]
        else:
            self._llama.llama_memory_seq_rm(self._memory, seq.slot, -1, -1)
        seq.sampler.close()
        del self._running[seq.slot]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _utf8_tokens_missing(text: bytes) -> int:
    """create_completion's count of the tokens a UTF-8 character cut at the text's end still
    needs (0 when the text ends on a whole character)."""
    missing = 0
    for k, char in enumerate(text[-3:]):
        k = 3 - k
        for num, pattern in ((2, 192), (3, 224), (4, 240)):
            if num > k and pattern & char == pattern:
                missing = num - k
    return missing


def _stop_prefix(text: bytes, stops: list[bytes]) -> int:
    """How many bytes at the end of text could be the start of a stop string: held back."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest
