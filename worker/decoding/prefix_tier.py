"""The decoder's side of the prefix cache: starts kept before their cells are lost, and
restored for a new prompt when that beats computing them.

The KV streams keep one prompt each; the prefix cache (``worker/prefix_cache/``) keeps many
more, in host RAM and on disk, as llama.cpp's server keeps finished prompts in host RAM
(``--cache-ram``). Two moments:

- **A stream is reclaimed** (``KvStreams`` puts a ``Save`` before the operations that would
  lose what a free stream kept): its reusable cells are saved, unless the RAM tier keeps that
  start already (a start restored from it, say), so the same bytes are not copied twice.
- **A prompt is admitted**: if a tier keeps a longer start of it than any stream of its scope
  offers, by enough to be worth it, that start goes into the lowest free stream (the stream
  ``KvStreams.place`` then gives the prompt, which reuses it as it would a stream's own).

Restored cells are the saved ones bit for bit (``kv_state.py``), and a saved start holds
only reusable cells, computed as a new prompt would compute them: a job's text does not depend
on whether its start was computed, reused in a stream, or restored from RAM or disk.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuq.prefix_blocks import BLOCK_TOKENS
from worker.decoding.batch_runner import BatchRunner
from worker.decoding.kv_streams import KvOp, KvStreams, Save
from worker.prefix_cache import CacheKey, KvLayout, PrefixCache
from worker.prefix_cache.cache import Tier

# A restore must give at least a block more than the streams offer, and a sixteenth of what it
# reads: reading a start back costs 0.011x (RAM) to 0.018x (disk) of computing it on this CPU
# (``python -m bench restore``), so a smaller gain would cost more than it saves.
RESTORE_GAIN_TOKENS = BLOCK_TOKENS
RESTORE_GAIN_SHARE = 16


@dataclass(frozen=True, slots=True)
class Restored:
    """A prompt's start put into a stream from a tier of the prefix cache."""

    stream: int
    tokens: int
    tier: Tier


class PrefixTier:
    """The prefix cache, as one decoding context (``layout``) sees it."""

    def __init__(self, cache: PrefixCache, layout: KvLayout) -> None:
        self.cache = cache
        self._layout = layout.digest()

    def key(self, scope: bytes) -> CacheKey:
        """A cache scope's key in this context (``scope``: the namespace salt of the model and tenant)."""
        return CacheKey(scope, self._layout)

    def keep(self, runner: BatchRunner, saves: Iterable[Save]) -> None:
        """Each start into the cache, unless the RAM tier keeps it already."""
        for op in saves:
            key = self.key(op.scope)
            if self.cache.covers(key, op.tokens):
                continue
            data = runner.save(op.stream, keep=len(op.tokens))
            if data is not None:
                self.cache.save(key, op.tokens, data)

    def restore(self, runner: BatchRunner, kv: KvStreams, prompt: list[int], scope: bytes) -> Restored | None:
        """The longest start of ``prompt`` a tier keeps, into the lowest free stream, when it
        beats what the streams offer; None when none does (or llama.cpp refused the bytes)."""
        limit, unit = kv.reuse_bounds(len(prompt))
        offered = kv.best_reuse(prompt, scope)
        # found - offered >= found / SHARE, that is found >= offered * SHARE / (SHARE - 1)
        worth = max(offered + RESTORE_GAIN_TOKENS, -(-offered * RESTORE_GAIN_SHARE // (RESTORE_GAIN_SHARE - 1)))
        found = self.cache.lookup(self.key(scope), prompt, limit=limit, unit=unit, at_least=worth)
        if found is None:
            return None
        stream = kv.lowest_free()
        self.apply(runner, kv.reclaim(stream))
        with self.cache.restoring(found):
            ok = runner.restore(stream, found.entry.data, keep=found.tokens)
        self.cache.restored(found, ok=ok)
        if not ok:
            return None
        kv.restored(stream, prompt[: found.tokens], scope)
        return Restored(stream, found.tokens, found.tier)

    def apply(self, runner: BatchRunner, ops: Iterable[KvOp]) -> None:
        """``KvStreams``'s operations in order: saves here, the others by the runner."""
        for op in ops:
            if isinstance(op, Save):
                self.keep(runner, (op,))
            else:
                runner.apply((op,))
