"""A step's output committed: sequences advanced from what a decoded batch gave, and endings.

From a :class:`~worker.decoding.batch_runner.StepOutput` alone (the batch, so which row is
whose, llama.cpp's code and the logits rows), each row's sequence draws its token with its
own sampler chain and appends its text; a prompt chunk's sequence records what its stream
now holds, and once its prompt is in, its request's waiting samples are forked from it
(their streams copied) and all draw their first token from its last row. Then the end rules
of ``create_completion`` (end-of-text, stop strings, length), and the requests that end with
them. ``NO_KV_ROOM``: nothing was decoded, and the newest request goes back to its queue.

Cancellations and deadlines end requests between steps (``cut_off``). Nothing here touches
llama.cpp but through the output's logits and the sequences' samplers, so it is tested with
stand-ins (tests/worker/decoding/test_commit.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from worker.decoding.batch_runner import NO_KV_ROOM, Logits, StepOutput
from worker.decoding.constraint import ConstraintBroken
from worker.decoding.kv_streams import KvOp, KvStreams
from worker.decoding.logprobs import token_logprob
from worker.decoding.plan import Chunk
from worker.decoding.results import DAMAGED_LOGITS, Finished, Generation, Piece
from worker.decoding.sequences import Request, Sequence, Sequences, State
from worker.decoding.text import HELD

log = logging.getLogger(__name__)


class Commit:
    """Advances the decoder's sequences; streaming sequences' text collects in ``pieces``."""

    def __init__(
        self,
        sequences: Sequences,
        kv: KvStreams,
        *,
        piece: Callable[[int], bytes],
        is_eog: Callable[[int], bool],
        bos: int,
    ) -> None:
        self._seqs = sequences
        self._kv = kv
        self._token_piece = piece  # a token's bytes (token_pieces.py)
        self._is_eog = is_eog
        self._bos = bos
        self.pieces: list[Piece] = []  # streaming sequences' text since the decoder handed it out

    def __call__(self, output: StepOutput) -> tuple[list[Finished], tuple[KvOp, ...]]:
        """The requests that ended, and the KV operations to apply before the next decode
        (the forks' stream copies)."""
        if output.code == NO_KV_ROOM:
            return [self.evict_newest()], ()
        live, logits, batch = self._seqs.live, output.logits, output.batch
        finished: list[Finished] = []
        ops: list[KvOp] = []
        for row, place in batch.decode:
            seq = live.get(row.sequence)
            if seq is not None:  # its request may have ended at an earlier row (damaged logits)
                finished += self._sample(seq, logits, place)
        for chunk, place in batch.beside:
            seq = live.get(chunk.sequence)
            if seq is not None:
                finished += self._commit_chunk(seq, chunk, logits, place, ops, beside=True)
        if batch.chunk is not None:
            seq = live.get(batch.chunk.sequence)
            if seq is not None:
                finished += self._commit_chunk(seq, batch.chunk, logits, len(batch.rows) - 1, ops)
        return finished, tuple(ops)

    def _commit_chunk(
        self, seq: Sequence, chunk: Chunk, logits: Logits, last_row: int, ops: list[KvOp], *, beside: bool = False
    ) -> list[Finished]:
        """The chunk's KV is in; ``last_row``: its last row's place in its batch (beside: among
        the decode rows, a pass of two rows or more)."""
        request = seq.request
        rows = chunk.end - chunk.start
        if rows == self._kv.chunk_tokens or (
            self._kv.any_prefix and (rows >= 2 or beside)
        ):  # reusable by later prompts
            self._kv.computed(seq.id, request.prompt[chunk.start : chunk.end])
        seq.fed = chunk.end
        if request.echo:
            self._prompt_logprobs(request, chunk, logits)
        if not chunk.last:
            return []
        seq.state = State.DECODING
        seqs = [seq, *self._fork(seq, ops)]
        out: list[Finished] = []
        for each in seqs:
            if each.id in self._seqs.live:
                out += self._sample(each, logits, last_row)
        return out

    def _fork(self, parent: Sequence, ops: list[KvOp]) -> list[Sequence]:
        """The request's waiting samples, each given a copy of the parent's KV stream, once the
        prompt is in: the prompt is evaluated once for all of them."""
        children = self._seqs.forks_of(parent)
        for child in children:
            ops += self._kv.fork(parent.id, child.id).ops
            child.fed = parent.fed
            self._seqs.start(child)
        return children

    def _sample(self, seq: Sequence, logits: Logits, place: int) -> list[Finished]:
        """create_completion's loop body for one token: EOS, stop strings, length."""
        request = seq.request
        row = logits.row(place)
        if not np.isfinite(row).all():  # NaN logits would still sample some token: an empty "success"
            return [self.fail(request, DAMAGED_LOGITS)]
        try:
            token = self._draw(seq, logits, place)
        except ConstraintBroken as exc:
            return [self.fail(request, str(exc))]
        if seq.first_token_at is None:
            seq.first_token_at = time.perf_counter()
        if token is None or self._is_eog(token):
            return self._end(seq, "stop")
        seq.completion.append(token)
        seq.unsent_tokens += 1
        if request.logprobs is not None:
            seq.logprobs.append(token_logprob(logits.row(place), token, request.logprobs))
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

    @staticmethod
    def _draw(seq: Sequence, logits: Logits, place: int) -> int | None:
        """The sequence's next token from its sampler chain; with a constraint, drawn among
        the tokens its grammar allows, and None once the grammar is complete (nothing may
        follow: the sequence ends as at end-of-text)."""
        constraint = seq.constraint
        if constraint is None:
            return logits.sample(seq.sampler, place)
        if constraint.complete:
            return None
        with constraint.masked(logits.row(place)):
            token = logits.sample(seq.sampler, place)
        constraint.consume(token)
        return token

    def _piece(self, token: int, *, first: bool) -> bytes:
        """A token's bytes, as ``LlamaModel.detokenize`` gives them (which drops the leading
        space of a BOS token that starts the text)."""
        piece = self._token_piece(token)
        return piece[1:] if first and token == self._bos and piece[:1] == b" " else piece

    @staticmethod
    def _prompt_logprobs(request: Request, chunk: Chunk, logits: Logits) -> None:
        """Each row of the chunk gives the next prompt token's log-probability (the prompt's
        last row gives the first sampled token's, in ``_sample``)."""
        prompt, top = request.prompt, request.logprobs or 0
        for row, position in enumerate(range(chunk.start, min(chunk.end, len(prompt) - 1))):
            request.prompt_logprobs.append(token_logprob(logits.row(row), prompt[position + 1], top))

    # ------------------------------------------------------------- endings

    def cut_off(self, now: float) -> list[Finished]:
        """Requests cancelled or past their deadline (``now``: monotonic) leave before the
        step; the others go on."""
        out = []
        for request in list(self._seqs.requests.values()):
            if request.cancel.is_set():
                for seq in self._unfinished(request):
                    out += self._end(seq, "cancelled")
            elif request.deadline is not None and now >= request.deadline:
                out.append(self.fail(request, "timed out (GPUQ_JOB_TIMEOUT_S)"))
        return out

    def evict_newest(self) -> Finished:
        """No KV room for this step: the newest request goes back to its queue (llama.cpp left
        the cache as it was, and nothing was committed, so the others simply step again)."""
        newest = self._seqs.newest_request()
        log.warning("no KV cache room for %d requests; sending %s back", len(self._seqs.requests), newest.key)
        finished = self.fail(newest, "no KV cache room")
        return Finished(finished.key, evicted=True)

    def abandon(self) -> None:
        """Drops every request without an ending (decoding failed: the context is unusable)."""
        for request in list(self._seqs.requests.values()):
            self.fail(request, "abandoned")

    def _end(self, seq: Sequence, reason: str) -> list[Finished]:
        seq.finish_reason = reason
        self._leave(seq)
        request = seq.request
        if request.stream:
            self._hand_out(seq, len(seq.text_bytes()), final=True)
        if not request.finished:
            return []
        del self._seqs.requests[request.key]
        return [Finished(request.key, tuple(self._generation(s) for s in request.sequences))]

    def _leave(self, seq: Sequence) -> None:
        if seq.state is not State.PARKED:  # a parked sequence holds no stream
            self._kv.release(seq.id)
        self._seqs.finish(seq)

    def _unfinished(self, request: Request) -> list[Sequence]:
        """Its sequences that hold a stream; those still waiting for its prompt are dropped
        (a request cancelled while its prompt goes in ends with the one sample it has)."""
        for seq in [s for s in request.sequences if s.state is State.WAITING]:
            self._seqs.finish(seq)
        return [s for s in request.sequences if s.state is not State.FINISHED]

    def fail(self, request: Request, error: str) -> Finished:
        """The request ends with an error, every sample of it."""
        for seq in self._unfinished(request):
            self._leave(seq)
        del self._seqs.requests[request.key]
        return Finished(request.key, error=error)

    def _generation(self, seq: Sequence) -> Generation:
        request = seq.request
        now = time.perf_counter()
        first = seq.first_token_at
        logprobs = None
        if request.logprobs is not None:
            kept = len(seq.logprobs) if seq.cut is None else sum(1 for at in seq.starts if at < seq.cut)
            logprobs = tuple(seq.logprobs[:kept])
        return Generation(
            text=seq.text_bytes().decode("utf-8", errors="ignore"),
            finish_reason=seq.finish_reason or "stop",
            prompt_tokens=len(request.prompt),
            completion_tokens=len(seq.completion),
            token_ids=tuple(seq.completion),
            index=seq.index,
            logprobs=logprobs,
            prompt_logprobs=tuple(request.prompt_logprobs) if request.echo else None,
            stop_sequence=seq.text.matched if seq.cut is not None else None,
            cached_tokens=request.cached,
            cached_ram_tokens=request.cached_ram,
            cached_disk_tokens=request.cached_disk,
            parks=seq.parks,
            resumes=seq.resumes,
            parked_ms=int(seq.parked_s * 1000),
            prompt_ms=int((first - request.admitted_at) * 1000) if first is not None else None,
            eval_ms=int((now - first) * 1000) if first is not None else None,
        )

    def _hand_out(self, seq: Sequence, upto: int, *, final: bool = False) -> None:
        chunk = seq.text.take(upto, final=final)
        if chunk or (final and seq.unsent_tokens):
            covered = seq.logprobs[len(seq.logprobs) - seq.unsent_tokens :] if seq.request.logprobs is not None else []
            self.pieces.append(Piece(seq.request.key, chunk, seq.unsent_tokens, seq.index, tuple(covered)))
            seq.unsent_tokens = 0
