"""A decoder step planned as data: which sequences decode a token, which prompt chunks go in.

A pure function of the live sequences (and, for throwaway rows, of where each KV stream
ends), tested without llama.cpp. The plan comes as batches, each one ``llama_decode``: the
runner decodes them one by one (``batch_runner.py``), and each output is committed before
the next (``commit.py``: sampled tokens, states advanced).

- **Decode rows**: the last sampled token of every decoding sequence, in stream order (with a
  KV stream per sequence llama.cpp puts only consecutive sequence ids in one micro-batch).
- **Logits rows**: every decode row, and the last row of a prompt's last chunk (its first
  token), or every prompt row of a request that asked for its prompt's log-probabilities.
- **Prefill chunks**: a prompt is fed in chunks with fixed boundaries, ``[k * C, (k + 1) * C)``,
  each chunk decoded by itself in its own ``llama_decode``. So a prompt position's KV is
  always computed the same way, whatever else runs and whatever was reused before it: the
  condition for reusing KV from another sequence and still giving the same text (see
  ``kv_streams.py``). Where any common prefix is reused (``aligned=False``, the CPU's
  default), chunks of C start where the reuse ended, and none is a lone last token. While
  others decode, a step takes one chunk (a long prompt never stalls them for long); with
  nothing decoding, chunks up to ``N_BATCH`` tokens a step.
- **Prompt rows beside the decode rows** (``short_tail``, where the decoder allows it): while
  others decode, a prompt with at most ``short_tail`` tokens left goes in a token a step
  inside the decode rows' own pass instead of in a pass of its own, one such row for every
  four decode rows, lowest stream first (llama.cpp puts one row per KV stream in a
  micro-batch, so a prompt cannot put more there; the decoder gives the oldest prompts not
  yet begun the lowest streams, so lowest is also oldest). A pass of its own costs most of
  a decode step however few its rows (measured on the CPU: 19 ms for 3 rows beside a 22 ms
  step of 4 rows; a row beside them, 4.4 ms): beside the decode rows a short prompt costs
  less in all, and delays the decoding sequences' next token by a row, not by a pass.
- **Throwaway rows** (with flash attention): the decode rows' streams are made one unbroken
  run of two or more, a row that no sequence owns in each stream missing from it, after
  that stream's last cell (``_rows_batch`` says why); the runner removes their cells once
  decoded, and they are not counted as anyone's tokens.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

N_BATCH = 512  # tokens a step at most (llama-cpp-python's default n_batch)


@dataclass(frozen=True, slots=True)
class Live:
    """What the planner needs of a live sequence."""

    id: int
    stream: int
    admitted: int  # admission order: older prompts are fed first
    prompt: Sequence[int]
    fed: int  # prompt tokens whose KV its stream holds
    pending: int | None  # the token sampled last, not yet decoded (None: still prefilling)
    position: int  # where ``pending`` goes
    prompt_logits: bool = False  # every prompt row's logits are wanted (``echo`` with log-probabilities)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)


@dataclass(frozen=True, slots=True)
class Row:
    sequence: int
    stream: int
    token: int
    position: int


@dataclass(frozen=True, slots=True)
class Chunk:
    sequence: int
    stream: int
    start: int  # prompt positions [start, end)
    end: int
    last: bool  # ends the prompt: its last row's logits give the first token
    every_row: bool = False  # logits for every row (the prompt's own log-probabilities), not only the last

    def wants_logits(self, position: int) -> bool:
        return self.every_row or (self.last and position == self.end - 1)


@dataclass(frozen=True, slots=True)
class Throwaway:
    """A row decoded only to keep the decode rows' streams one unbroken run: in a stream
    without a row, after its last cell, its cell removed once decoded."""

    stream: int
    position: int


@dataclass(frozen=True, slots=True)
class ThrowawayRows:
    """What throwaway rows need (with flash attention): each stream's next free position
    (llama.cpp's last cell there, plus one), a stream's context, the token they carry."""

    ends: tuple[int, ...]
    n_ctx_per_seq: int
    token: int


BatchRow = tuple[int, int, int, bool]  # token, position, stream, logits wanted


@dataclass(frozen=True, slots=True)
class Batch:
    """One ``llama_decode``: its rows in stream order, and which sequence each one serves.
    Either the step's decode rows (each plan row and beside chunk with its row's place, and
    the throwaway rows), or one prompt chunk in a pass of its own (its last row last)."""

    rows: tuple[BatchRow, ...]
    decode: tuple[tuple[Row, int], ...] = ()
    beside: tuple[tuple[Chunk, int], ...] = ()
    throwaway: tuple[Throwaway, ...] = ()
    chunk: Chunk | None = None

    @property
    def counted(self) -> int:
        """Its rows that are a sequence's (the shares of energy)."""
        return len(self.rows) - len(self.throwaway)


@dataclass(frozen=True, slots=True)
class StepPlan:
    rows: tuple[Row, ...]
    chunks: tuple[Chunk, ...]
    beside: tuple[Chunk, ...] = ()  # one-token chunks decoded in the rows' pass
    throwaway: tuple[Throwaway, ...] = ()
    batches: tuple[Batch, ...] = ()  # in order: the decode rows' pass, then each chunk's

    @property
    def prompt_tokens(self) -> int:
        return sum(c.end - c.start for c in (*self.chunks, *self.beside))


def chunk_end(fed: int, prompt_len: int, chunk_tokens: int, *, aligned: bool = True) -> int:
    """Where the chunk starting at ``fed`` ends. ``aligned``: the next fixed boundary, or the
    prompt's end. Otherwise ``chunk_tokens`` on from ``fed``, but never leaving one token
    alone at the end: every prompt row is computed in a pass of two rows or more (a one-row
    pass takes other kernels on the CPU, see ``kv_streams.py``), and no pass holds more than
    ``chunk_tokens`` rows (with flash attention, 64 rows take other kernels again)."""
    if aligned:
        return min((fed // chunk_tokens + 1) * chunk_tokens, prompt_len)
    end = min(fed + chunk_tokens, prompt_len)
    if prompt_len - end == 1:  # leave two for the last chunk, or take the last one along
        return end - 1 if end - fed > 2 else prompt_len
    return end


def plan_step(
    live: Iterable[Live],
    *,
    chunk_tokens: int,
    aligned: bool = True,
    short_tail: int = 0,
    throwaway: ThrowawayRows | None = None,
) -> StepPlan:
    """The step's decode rows and prompt chunks, and the batches that decode them.
    ``throwaway``: the decode rows' streams are made one unbroken run of two or more (with
    flash attention; see ``_rows_batch``); None: never."""
    sequences = sorted(live, key=lambda s: s.admitted)
    rows = tuple(
        Row(s.id, s.stream, s.pending, s.position)
        for s in sorted(sequences, key=lambda s: s.stream)
        if s.pending is not None
    )

    def rides(s: Live) -> bool:  # fed beside the decode rows, never by a pass of its own
        return bool(rows) and s.pending is None and not s.prompt_logits and s.prompt_len - s.fed <= short_tail

    # Lowest streams first: the decoding sequences hold the lowest (the decoder moves them down),
    # and a row in a stream beyond one without a row takes a throwaway row there too.
    riders = sorted((s for s in sequences if rides(s)), key=lambda s: s.stream)[: max(1, len(rows) // 4)]
    beside = tuple(Chunk(s.id, s.stream, s.fed, s.fed + 1, s.fed + 1 == s.prompt_len) for s in riders)
    budget = chunk_tokens if rows else N_BATCH
    chunks: list[Chunk] = []
    for s in sequences:
        if rides(s):
            continue
        fed = s.fed
        while s.pending is None and fed < s.prompt_len and budget > 0:
            end = chunk_end(fed, s.prompt_len, chunk_tokens, aligned=aligned)
            if chunks and end - fed > budget:
                break
            chunks.append(Chunk(s.id, s.stream, fed, end, end == s.prompt_len, s.prompt_logits))
            budget -= end - fed
            fed = end
        if budget <= 0:
            break
    prompts = {s.id: s.prompt for s in sequences}
    batches = [_rows_batch(rows, beside, prompts, throwaway)] if rows else []
    batches += [_chunk_batch(c, prompts[c.sequence]) for c in chunks]
    thrown = batches[0].throwaway if rows else ()
    return StepPlan(rows, tuple(chunks), beside, thrown, tuple(batches))


def _rows_batch(
    rows: tuple[Row, ...], beside: tuple[Chunk, ...], prompts: dict[int, Sequence[int]], rule: ThrowawayRows | None
) -> Batch:
    """The step's decode rows, and the prompt rows beside them, in one pass.

    With flash attention, ggml's CPU kernel splits the KV of a pass that holds one row of one
    stream over its threads (from 512 cells on), which rounds otherwise than the same row
    beside other streams' rows. llama.cpp makes a micro-batch of consecutive streams only, so
    a lone row, or rows with a stream between them that does not decode (it is prefilling),
    would each be such a pass. So the rows' streams are made one unbroken run of two or more:
    a throwaway row goes into each stream missing from it (after its last cell, removed once
    decoded), and a sequence's logits are the same alone as beside others."""
    lines: dict[int, BatchRow] = {r.stream: (r.token, r.position, r.stream, True) for r in rows}
    for c in beside:
        lines[c.stream] = (prompts[c.sequence][c.start], c.start, c.stream, c.last)
    thrown: list[Throwaway] = []
    if rule is not None and len(rule.ends) > 1:
        low, high = min(lines), max(lines)
        if low == high:
            low, high = (low, low + 1) if low + 1 < len(rule.ends) else (low - 1, low)
        for stream in range(low, high + 1):
            position = rule.ends[stream]
            if stream not in lines and position < rule.n_ctx_per_seq:
                thrown.append(Throwaway(stream, position))
    extra = [(rule.token, t.position, t.stream, False) for t in thrown] if rule is not None else []
    ordered = tuple(sorted([*lines.values(), *extra], key=lambda row: row[2]))
    place = {row[2]: i for i, row in enumerate(ordered)}
    return Batch(
        ordered,
        decode=tuple((r, place[r.stream]) for r in rows),
        beside=tuple((c, place[c.stream]) for c in beside),
        throwaway=tuple(thrown),
    )


def _chunk_batch(chunk: Chunk, prompt: Sequence[int]) -> Batch:
    rows = tuple((prompt[p], p, chunk.stream, chunk.wants_logits(p)) for p in range(chunk.start, chunk.end))
    return Batch(rows, chunk=chunk)
