"""Continuous batching: one llama.cpp context that decodes many sequences together.

Decoding is bound by memory bandwidth: reading the weights once for K tokens costs little
more than reading them for one, so K sequences decoded together give several times the
tokens per second of one after another (llama.cpp's server slots, Ollama's
``OLLAMA_NUM_PARALLEL`` and vLLM do the same).

Requests and their sequences, each in an explicit state, are ``sequences.py``'s; which KV
stream a sequence holds, and what each stream holds, ``kv_streams.py``'s alone. A step, as
vLLM's scheduler and llama.cpp's server slots separate it, is three parts:

- **plan** (``plan.py``): a pure function of the live sequences and where each stream ends:
  the decode rows, the prompt chunks, the throwaway rows, as batches;
- **run** (``batch_runner.py``): one ``llama_decode`` of a planned batch, returning a step
  output (the batch, so which row is which sequence's; llama.cpp's code; the logits rows);
- **commit** (``commit.py``): sequences advanced from that output alone: tokens drawn with
  each sequence's own sampler chain, texts appended, states moved on, endings.

Each batch is committed before the next is decoded (its logits rows last until then).
Nothing is changed before a decode and undone after it. Each sequence's sampler chain and
end rules are ``Llama.create_completion``'s own (EOS, stop strings, length, the UTF-8
hold-back), so a seeded (or greedy) job gives the same text alone, beside others, and
whether or not its prompt's start came from the cache. This class only orchestrates: it
admits requests, moves streams before a step (``KvStreams``), and runs plan, run, commit.

With a prefix cache (``prefix_tier.py``), a stream's start is saved before its cells are lost,
and a new prompt's start restored from host RAM or disk when a tier keeps more of it than the
streams do. A request that outranks decoding sequences when no stream is free has them parked
for it (``parking.py``): their cells to host memory, resumed exactly where they stopped once
a stream is free again.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterable
from typing import Any

from gpuq.prefix_blocks import BLOCK_TOKENS
from worker.decoding.batch_runner import NO_KV_ROOM, BatchRunner
from worker.decoding.commit import Commit
from worker.decoding.constraint import SequenceConstraint
from worker.decoding.kv_streams import KvOp, KvStreams
from worker.decoding.logprobs import TokenLogprob
from worker.decoding.parking import Parking
from worker.decoding.plan import Live, StepPlan, ThrowawayRows, plan_step
from worker.decoding.prefix_tier import PrefixTier
from worker.decoding.results import PARKED_CELLS_REFUSED, Finished, Piece
from worker.decoding.sampler import Sampling, sampler_chain
from worker.decoding.sequences import Request, Sequence, Sequences, State
from worker.decoding.text import CompletionText
from worker.decoding.token_pieces import TokenPieces
from worker.prefix_cache import KvLayout, PrefixCache

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
# With strict priority, a sequence waits at most this many steps (about 10 s here) for more
# urgent ones, so a stream of urgent work cannot stop it for good.
MAX_WAITING_STEPS = 512


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
        prefix_cache: PrefixCache | None = None,
        gpu_layers: int = 0,
        strict_priority: bool = False,
    ) -> None:
        import llama_cpp

        self.slots = slots
        self.n_ctx_per_seq = n_ctx_per_seq
        # While a more urgent sequence is live, less urgent ones skip their steps (on the CPU a
        # step's cost grows with its rows, so the urgent one then decodes as fast as alone).
        self.strict_priority = strict_priority
        if flash_attn and any_prefix:
            chunk_tokens = min(chunk_tokens, FLASH_ATTN_CHUNK_TOKENS)
        self.chunk_tokens = chunk_tokens
        self._flash_attn = flash_attn
        # model: llama_cpp._internals.LlamaModel, shared: weights are loaded once
        self._runner = BatchRunner(
            model, slots=slots, n_ctx_per_seq=n_ctx_per_seq, threads=threads, flash_attn=flash_attn
        )
        self._n_vocab = model.n_vocab()
        self._bos = model.token_bos()
        self._pieces = TokenPieces(model.vocab)
        self._tier: PrefixTier | None = None
        if prefix_cache is not None and prefix_cache.enabled and prompt_cache:
            layout = KvLayout.of_context(
                self._runner.params,
                reuse="any-prefix" if any_prefix else "whole-chunks",
                chunk_tokens=chunk_tokens,
                gpu_layers=gpu_layers,
            )
            self._tier = PrefixTier(prefix_cache, layout)
        self.kv = KvStreams(
            slots,
            chunk_tokens=chunk_tokens,
            reuse=prompt_cache,
            any_prefix=any_prefix,
            save_from=BLOCK_TOKENS if self._tier is not None else None,
        )
        self._seqs = Sequences()
        vocab = model.vocab
        self._commit = Commit(
            self._seqs,
            self.kv,
            piece=self._pieces,
            is_eog=lambda token: bool(llama_cpp.llama_vocab_is_eog(vocab, token)),
            bos=self._bos,
        )
        self._parking = Parking(self._runner, self.kv, self._seqs, self._apply)
        self._ids = itertools.count()
        self.last_plan: StepPlan | None = None  # what the last step decoded
        # Streams the next step frees for sure: sequences whose next token is their last by
        # length. Set by the engine's thread after each step, read by the desk's, which takes
        # jobs for them while that step runs, so that they go in at the step after it.
        self.freed_next_step = 0
        self.reused_tokens = 0  # prompt tokens taken from a KV stream instead of decoded
        self._abandoned = False

    def close(self) -> None:
        """Frees the context; with a prefix cache, the starts the free streams kept are saved
        first (a model unloaded between two cron runs finds them again)."""
        if self._tier is not None and not self._abandoned:
            self._tier.keep(self._runner, self.kv.kept())
        for seq in [*self._seqs.live.values(), *self._seqs.waiting.values(), *self._seqs.parked.values()]:
            seq.sampler.close()
        self._seqs.live.clear()
        self._seqs.waiting.clear()
        self._seqs.parked.clear()
        self._seqs.requests.clear()
        self._runner.close()

    @property
    def tokens_decoded(self) -> int:
        """Every token any llama_decode of this context took: the shares of energy."""
        return self._runner.tokens_decoded

    @property
    def decode_seconds(self) -> float:
        """Time inside llama_decode: the rest of a step is the engine's own cost."""
        return self._runner.decode_seconds

    @property
    def free_slots(self) -> int:
        """KV streams free for new sequences (a request of ``n`` samples needs ``n``): those
        free, less one for each sample waiting for its request's prompt and one for each
        parked sequence (it resumes first)."""
        return self.kv.free - len(self._seqs.waiting) - len(self._seqs.parked)

    def free_slots_for(self, priority: int) -> int:
        """KV streams free for a request of ``priority``: a parked sequence as urgent as it or
        more resumes first; one less urgent waits for it."""
        parked_first = sum(1 for s in self._seqs.parked.values() if s.request.priority <= priority)
        return self.kv.free - len(self._seqs.waiting) - parked_first

    def parkable(self, priority: int) -> int:
        """How many decoding sequences a request of ``priority`` could have parked for it."""
        return len(self._parking.victims(priority))

    def park_for(self, priority: int, streams: int) -> int:
        """Parks up to ``streams`` decoding sequences less urgent than ``priority`` (the least
        urgent, newest first; ``parking.py``); how many it parked. Between steps only."""
        return self._parking.park_for(priority, streams)

    @property
    def parks(self) -> int:
        """Sequences parked for more urgent requests since the context was made."""
        return self._parking.parks

    @property
    def resumes(self) -> int:
        """... and resumed."""
        return self._parking.resumes

    @property
    def active(self) -> int:
        """Requests admitted and not yet ended."""
        return len(self._seqs.requests)

    def live_keys(self) -> list[str]:
        """The keys of the requests admitted and not yet ended."""
        return list(self._seqs.requests)

    def abandon(self) -> None:
        """Drops every request without an ending (decoding failed: the context is unusable,
        and nothing of it is saved)."""
        self._abandoned = True
        self._commit.abandon()

    def live_slots(self) -> list[int]:
        """The KV streams live sequences hold."""
        return sorted(self.kv.stream_of(seq_id) for seq_id in self._seqs.live)

    def token_bytes(self, token: int) -> bytes:
        """A token's bytes, as the vocabulary has them (safe from the desk's thread)."""
        return self._pieces(token)

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
        scope: bytes = b"",
        priority: int = 1,
    ) -> int:
        """Adds a request; its prompt goes in from the next step. Needs ``n`` free slots.
        Returns how many prompt tokens it takes from the cache: a stream's of its ``scope``
        (the cache scope, ``gpuq.prefix_blocks.namespace_salt``: other scopes' never), or the
        prefix cache's (``request.cached_ram``, ``cached_disk``). A ``stream`` request's text is
        also handed out piece by piece (``take_pieces``). ``logprobs``: each sampled token's
        log-probability and its ``logprobs`` best alternatives; with ``echo`` the prompt's
        too, so its prompt is decoded whole (no cache: reused cells have no logits). A
        ``constraint`` masks each of its samples' logits to what its grammar allows.
        ``priority``: its job's (lower is more urgent), which decides who is parked for whom."""
        if not prompt:
            raise ValueError("the prompt has no tokens")
        if len(prompt) >= self.n_ctx_per_seq:
            raise ValueError(f"the prompt has {len(prompt)} tokens; this model's context holds {self.n_ctx_per_seq}")
        free = self.free_slots_for(priority)
        if n < 1 or n > free:
            raise ValueError(f"a request of {n} samples needs {n} free slots; {free} are free")
        if key in self._seqs.requests:
            raise ValueError(f"{key} is already decoding here")
        # create_completion's rule: the completion is cut where the context ends.
        if max_tokens <= 0 or max_tokens + len(prompt) >= self.n_ctx_per_seq:
            max_tokens = self.n_ctx_per_seq - len(prompt)
        request = Request(
            key=key,
            prompt=list(prompt),
            max_tokens=max_tokens,
            sampling=sampling,
            stops=[s for s in stop if s],
            cancel=cancel or threading.Event(),
            deadline=deadline,
            stream=stream,
            admitted=self._seqs.next_admission(),
            priority=priority,
            scope=scope,
            logprobs=logprobs,
            echo=echo and logprobs is not None,
        )
        if request.echo:
            request.prompt_logprobs = [TokenLogprob(request.prompt[0], None)]
        # The first sample prefills the prompt; the others wait for it, each its own sampler
        # (seeded seed + index) and its own copy of the grammar, and are forked once it is in.
        first = self._sequence(request, 0, constraint)
        for index in range(1, n):
            self._sequence(request, index, constraint.fork() if constraint is not None else None)
        self._place(first, scope)
        self.reused_tokens += request.cached
        self._seqs.requests[key] = request
        return request.cached

    def _place(self, first: Sequence, scope: bytes) -> None:
        """A stream for the request's first sample, with as much of its prompt as a stream of
        its scope holds, or a tier of the prefix cache restores into it."""
        request = first.request
        reuse = not request.echo
        restored = None
        if reuse and self._tier is not None:
            restored = self._tier.restore(self._runner, self.kv, request.prompt, scope)
        placement = self.kv.place(first.id, request.prompt, reuse=reuse, scope=scope)
        self._apply(placement.ops)
        request.cached = first.fed = placement.reused
        if restored is not None and placement.stream == restored.stream:
            from_tier = min(restored.tokens, placement.reused)
            if restored.tier == "ram":
                request.cached_ram = from_tier
            else:
                request.cached_disk = from_tier

    def _sequence(self, request: Request, index: int, constraint: SequenceConstraint | None) -> Sequence:
        seq = Sequence(
            id=next(self._ids),
            request=request,
            index=index,
            sampler=sampler_chain(request.sampling, index, self._n_vocab),
            text=CompletionText.with_stops(request.stops),
            constraint=constraint,
            state=State.PREFILLING if index == 0 else State.WAITING,
        )
        self._seqs.add(seq)
        return seq

    def take_pieces(self) -> list[Piece]:
        """The streaming sequences' text produced since the last call, in order."""
        pieces, self._commit.pieces = self._commit.pieces, []
        return pieces

    def step(self) -> list[Finished]:
        """One step for every live sequence; returns the requests that ended."""
        finished = self._commit.cut_off(time.monotonic())
        finished += self._resume_parked()
        if self._seqs.live:
            self._move_down()
            self._order_waiting()
            stepping = self._stepping()
            for seq in self._seqs.live.values():
                seq.waited_steps += seq not in stepping
            plan = plan_step(
                self._views(stepping),
                chunk_tokens=self.chunk_tokens,
                aligned=not self.kv.any_prefix,
                short_tail=SHORT_TAIL_TOKENS if self._flash_attn and self.kv.any_prefix else 0,
                throwaway=self._throwaway_rows(),
            )
            finished += self._run(plan)
            self.last_plan = plan
        self.freed_next_step = sum(
            1
            for seq in self._stepping()
            if seq.state is State.DECODING and len(seq.completion) + 1 >= seq.request.max_tokens
        )
        return finished

    def _stepping(self) -> list[Sequence]:
        """The live sequences that step: all of them, or with strict priority those of the most
        urgent requests live and those that have waited ``MAX_WAITING_STEPS`` (the others wait,
        their cells in their streams)."""
        live = list(self._seqs.live.values())
        if not self.strict_priority or not live:
            return live
        top = min(seq.request.priority for seq in live)
        return [seq for seq in live if seq.request.priority == top or seq.waited_steps >= MAX_WAITING_STEPS]

    def _resume_parked(self) -> list[Finished]:
        """Parked sequences back into the streams free now; a request whose cells llama.cpp
        refused (never seen: the bytes come from this very context) fails."""
        lost = self._parking.resume_waiting()
        return [
            self._commit.fail(seq.request, PARKED_CELLS_REFUSED)
            for seq in lost
            if seq.request.key in self._seqs.requests
        ]

    def _run(self, plan: StepPlan) -> list[Finished]:
        """Each planned batch decoded, then committed before the next is decoded."""
        finished: list[Finished] = []
        for batch in plan.batches:
            if batch.chunk is not None and batch.chunk.sequence not in self._seqs.live:
                continue  # its request ended at an earlier row of this step (damaged logits)
            output = self._runner.run(batch)
            ended, ops = self._commit(output)
            self._apply(ops)
            finished += ended
            if output.code == NO_KV_ROOM:
                break
        return finished

    def _views(self, sequences: Iterable[Sequence]) -> list[Live]:
        stream_of = self.kv.stream_of
        return [
            Live(
                id=seq.id,
                stream=stream_of(seq.id),
                admitted=seq.request.admitted,
                prompt=seq.request.prompt,
                fed=seq.fed,
                pending=seq.pending,
                position=seq.position,
                prompt_logits=seq.request.echo,
            )
            for seq in sequences
        ]

    def _throwaway_rows(self) -> ThrowawayRows | None:
        """With flash attention, what the plan needs to keep the decode rows' streams one
        unbroken run (``plan._rows_batch``)."""
        if not self._flash_attn or self.slots < 2:
            return None
        return ThrowawayRows(self._runner.stream_ends(), self.n_ctx_per_seq, self._bos)

    def _move_down(self) -> None:
        """Decoding sequences move down into free streams below them (``KvStreams.moves``)."""
        decoding = {seq.id for seq in self._seqs.live.values() if seq.state is State.DECODING}
        self._apply(self.kv.moves(decoding))

    def _order_waiting(self) -> None:
        """Prompts not yet begun (nothing in their streams) take the lowest streams they can,
        their own or free ones, oldest first (``KvStreams.order_waiting``). The prompt that goes
        in beside the decode rows next (lowest stream first, plan.py) is then the one that
        waited longest, never one that came after it into a stream just freed; and it lies
        next to the decode rows, where a row in a stream far above them would take a throwaway
        row in each stream between (plan.py), and once it decodes, a copy down."""
        waiting = sorted(
            (s for s in self._seqs.live.values() if s.state is State.PREFILLING and s.fed == 0),
            key=lambda s: s.request.admitted,
        )
        self._apply(self.kv.order_waiting([s.id for s in waiting]))

    def _apply(self, ops: Iterable[KvOp]) -> None:
        if self._tier is not None:
            self._tier.apply(self._runner, ops)
        else:
            self._runner.apply(ops)
