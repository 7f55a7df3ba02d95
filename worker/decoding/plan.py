"""A decoder step planned as data: which sequences decode a token, which prompt chunks go in.

A pure function of the live sequences, tested without llama.cpp. The decoder then decodes
the plan (``decoder.py``) and commits what came out (sampled tokens, states advanced).

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
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

N_BATCH = 512  # tokens a step at most (llama-cpp-python's default n_batch)


@dataclass(frozen=True, slots=True)
class Live:
    """What the planner needs of a live sequence."""

    id: int
    stream: int
    admitted: int  # admission order: older prompts are fed first
    prompt_len: int
    fed: int  # prompt tokens whose KV its stream holds
    pending: int | None  # the token sampled last, not yet decoded (None: still prefilling)
    position: int  # where ``pending`` goes
    prompt_logits: bool = False  # every prompt row's logits are wanted (``echo`` with log-probabilities)


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
class StepPlan:
    rows: tuple[Row, ...]
    chunks: tuple[Chunk, ...]

    @property
    def prompt_tokens(self) -> int:
        return sum(c.end - c.start for c in self.chunks)


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


def plan_step(live: Iterable[Live], *, chunk_tokens: int, aligned: bool = True) -> StepPlan:
    sequences = list(live)
    rows = tuple(
        Row(s.id, s.stream, s.pending, s.position)
        for s in sorted(sequences, key=lambda s: s.stream)
        if s.pending is not None
    )
    budget = chunk_tokens if rows else N_BATCH
    chunks: list[Chunk] = []
    for s in sorted(sequences, key=lambda s: s.admitted):
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
    return StepPlan(rows, tuple(chunks))
