"""The KV streams of one decoding context, and which token prefix each one holds.

A context has one KV stream per slot (llama.cpp's ``kv_unified=False``: a sequence's logits
never depend on its neighbours). This module is the one map of which sequence holds which
stream (nobody else keeps a sequence's stream), and decides, as plain data, which stream a
new sequence takes, what it can reuse there, and how live sequences move down; the batch
runner applies the operations to llama.cpp (``Copy``: ``llama_memory_seq_cp`` of a whole
stream, ``Trim``: ``llama_memory_seq_rm`` from a position on). A free stream's kept tokens
are lost in one place only, ``KvStreams._give``, when a sequence takes the stream.

- **Reuse is exact.** A stream's *reusable* tokens are the prompt tokens it computed in whole
  prefill chunks: positions ``[0, k * chunk)``, each chunk decoded by itself at its fixed
  place (see ``plan.py``). A prompt that starts with those tokens would compute the very same
  chunks in the very same way, so taking them from the stream gives the same KV cells, bit for
  bit, and the job's text does not depend on whether it hit the cache. Completion tokens (decoded
  one a step) and a prompt's last partial chunk are never reused.
- **Or any common prefix** (``any_prefix``, the default on the CPU): a stream's reusable
  tokens are every prompt token it computed in a pass of two rows or more, and a new prompt
  reuses all it shares with one, up to its last two tokens. On the CPU each row of a pass
  of several rows comes out the same whatever the pass's other rows and length (measured
  bit for bit, docs/architecture.md); a pass of one row takes other kernels, so the planner
  never makes one of a prompt (``plan.py``), and completion tokens (one row a step) are never
  reused. A GPU's kernels may change with a pass's shape, so on a GPU reuse stays on whole
  chunks (``GPUQ_WORKER_PROMPT_REUSE``).
- **A new sequence takes the lowest free stream**, so the streams that decode stay
  consecutive: llama.cpp puts only consecutive sequence ids in one micro-batch, and rows
  scattered over the streams cost a pass over the weights each. Its prefix comes from the
  stream, live or free, that shares the longest whole-chunk start with its prompt: its own
  stream's kept tokens (nothing to copy), or another stream copied whole first.
- **Moving down**: when a free stream lies below a decoding one, the sequence in the highest
  decoding stream moves into the lowest free one (a copy); the stream it leaves keeps what it
  held, reusable by the next prompt that shares it.
- **Scopes**: a stream's tokens belong to the cache scope of the sequence that computed them
  (the tenant's, unless an admin shares a model's cache: ``gpuq.prefix_blocks``); a prompt
  reuses only streams of its own scope, so no tenant learns from timing how another's prompts
  start.
- **Kept before lost** (``saves``, with the prefix cache on): when a free stream is reclaimed
  and tokens it kept would be lost, a ``Save`` of them goes first, so the prefix cache keeps
  them (``worker/decoding/prefix_tier.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Copy:
    """Copy stream ``src`` whole into ``dst`` (llama.cpp copies KV streams whole)."""

    src: int
    dst: int


@dataclass(frozen=True, slots=True)
class Trim:
    """Remove the cells of ``stream`` from position ``keep`` on (0: empty it)."""

    stream: int
    keep: int


@dataclass(frozen=True, slots=True)
class Save:
    """Keep what ``stream`` holds (``tokens``, from position 0, in ``scope``) before it is
    lost: applied before the operations that follow it."""

    stream: int
    tokens: tuple[int, ...]
    scope: bytes


KvOp = Copy | Trim | Save


@dataclass(slots=True)
class _Stream:
    reusable: list[int] = field(default_factory=list)  # prompt tokens computed reusably, from position 0
    owner: int | None = None  # the live sequence's id
    scope: bytes = b""  # the cache scope of the sequence that computed them


@dataclass(frozen=True, slots=True)
class Placement:
    stream: int
    reused: int  # prompt tokens whose KV the stream already holds (a multiple of the chunk unless any_prefix)
    ops: tuple[KvOp, ...]


class KvStreams:
    """The one map of which sequence holds which stream, and of what each stream holds."""

    def __init__(
        self,
        n_streams: int,
        *,
        chunk_tokens: int,
        reuse: bool = True,
        any_prefix: bool = False,
        save_from: int | None = None,
    ) -> None:
        self._streams = [_Stream() for _ in range(n_streams)]
        self._stream_of: dict[int, int] = {}  # live sequence id -> its stream
        self.chunk_tokens = chunk_tokens
        self.reuse = reuse  # GPUQ_WORKER_PROMPT_CACHE: off, every prompt is decoded whole
        self.any_prefix = any_prefix
        # With a prefix cache: a free stream's kept tokens, at least this many, are saved
        # before they are lost (None: never).
        self.save_from = save_from if reuse else None

    @property
    def free(self) -> int:
        return sum(1 for s in self._streams if s.owner is None)

    def owner(self, stream: int) -> int | None:
        return self._streams[stream].owner

    def stream_of(self, sequence: int) -> int:
        """The stream a live sequence holds (KeyError: it holds none)."""
        return self._stream_of[sequence]

    def holds(self, stream: int) -> list[int]:
        """The reusable tokens the stream holds now."""
        return list(self._streams[stream].reusable)

    def snapshot(self) -> list[tuple[tuple[int, ...], bytes]]:
        """Each stream's reusable tokens and their scope, copied: read by the heartbeat's
        thread for the fleet's prefix index (a copy of a list is one step under the GIL)."""
        return [(tuple(s.reusable), s.scope) for s in list(self._streams)]

    def scope_of(self, stream: int) -> bytes:
        return self._streams[stream].scope

    def reuse_bounds(self, prompt_tokens: int) -> tuple[int, int]:
        """How much of a prompt may be reused, and in what unit. The prompt's last token is
        always decoded (its logits are sampled), so at most the whole chunks before it (with
        ``any_prefix``, all but its last two tokens: what is left is a pass of two rows)."""
        if self.any_prefix:
            return max(0, prompt_tokens - 2), 1
        unit = self.chunk_tokens
        return (prompt_tokens - 1) // unit * unit, unit

    def place(self, sequence: int, prompt: list[int], *, reuse: bool = True, scope: bytes = b"") -> Placement:
        """The stream a new sequence takes (StopIteration: none free) and what it reuses of
        its own ``scope``'s streams (nothing when not ``reuse``: a prompt whose every row's
        logits are wanted)."""
        target = self.lowest_free()
        source, reused = self._best_source(prompt, target, scope) if reuse else (None, 0)
        ops: list[KvOp] = []
        if source is not None and source != target:
            ops += self._lost(target, [])  # the copy replaces every cell
            ops.append(Copy(source, target))
        ops += self._give(target, sequence, prompt[:reused], scope)
        ops.append(Trim(target, reused))
        return Placement(target, reused, tuple(ops))

    def best_reuse(self, prompt: list[int], scope: bytes) -> int:
        """The most of ``prompt`` a new sequence of ``scope`` would reuse from the streams now."""
        return self._best_source(prompt, self.lowest_free(), scope)[1]

    def _best_source(self, prompt: list[int], target: int, scope: bytes) -> tuple[int | None, int]:
        """The stream of ``scope`` sharing the longest reusable start with the prompt, and
        that length (``reuse_bounds``). The target itself wins a tie (nothing to copy)."""
        if not self.reuse:
            return None, 0
        limit, unit = self.reuse_bounds(len(prompt))
        best, best_len = None, 0
        order = [target] + [i for i in range(len(self._streams)) if i != target]
        for i in order:
            if self._streams[i].scope != scope:
                continue
            shared = _common_prefix(self._streams[i].reusable, prompt, limit)
            shared = shared // unit * unit
            if shared > best_len:
                best, best_len = i, shared
        return best, best_len

    def fork(self, parent: int, sequence: int) -> Placement:
        """A stream for a sequence forked from the live sequence ``parent`` (``n`` samples of
        one prompt): a copy of the parent's stream, cells and all."""
        source = self._stream_of[parent]
        target = self.lowest_free()
        ops = self._lost(target, [])
        ops.append(Copy(source, target))
        held = self._streams[source]
        ops += self._give(target, sequence, list(held.reusable), held.scope)
        return Placement(target, len(self._streams[target].reusable), tuple(ops))

    def computed(self, sequence: int, tokens: list[int]) -> None:
        """Reusable prompt tokens were decoded into the sequence's stream, right after what it holds."""
        self._streams[self._stream_of[sequence]].reusable.extend(tokens)

    def reclaim(self, stream: int) -> tuple[KvOp, ...]:
        """A free stream is about to be overwritten whole (a restore from the prefix cache):
        it holds nothing from now on; the ``Save`` of what it kept, if that is worth keeping."""
        s = self._streams[stream]
        assert s.owner is None, "a live sequence's stream is never reclaimed"
        ops = self._lost(stream, [])
        s.reusable = []
        return tuple(ops)

    def restored(self, stream: int, tokens: list[int], scope: bytes = b"") -> None:
        """A free stream's cells were restored from the prefix cache (``kv_state``): it holds
        these reusable tokens of ``scope``, for the next prompt that starts with them."""
        s = self._streams[stream]
        assert s.owner is None, "a live sequence's stream is never restored into"
        s.reusable, s.scope = list(tokens), scope

    def kept(self) -> tuple[Save, ...]:
        """A ``Save`` of every free stream's kept tokens worth keeping (the context is closing)."""
        saves: list[Save] = []
        for i, s in enumerate(self._streams):
            if s.owner is None:
                saves += [op for op in self._lost(i, []) if isinstance(op, Save)]
        return tuple(saves)

    def park(self, sequence: int) -> list[int]:
        """The sequence gives its stream up (parked; its cells were saved): the stream is free,
        keeping its reusable tokens for any prompt that shares them. Returns them, for
        ``resume``."""
        stream = self._stream_of[sequence]
        reusable = list(self._streams[stream].reusable)
        self.release(sequence)
        return reusable

    def resume(self, sequence: int, reusable: list[int], scope: bytes) -> Placement:
        """A parked sequence takes the lowest free stream again; its saved cells are restored
        there whole (the ``Save`` of what the stream kept first, if worth keeping)."""
        target = self.lowest_free()
        ops = self._lost(target, [])
        ops += self._give(target, sequence, list(reusable), scope)
        return Placement(target, len(reusable), tuple(ops))

    def order_waiting(self, waiting: list[int]) -> tuple[KvOp, ...]:
        """``waiting``: the sequences whose prompts have not begun (nothing reused, nothing
        fed: their streams are empty), oldest first. They take the lowest of their own streams
        and the free ones, the oldest the lowest: a free stream taken so is emptied, as
        ``place`` empties the one it gives (its kept tokens go), and the streams they leave
        are free and empty. No cell moves."""
        sources = [self._stream_of[s] for s in waiting]
        scopes = [self._streams[stream].scope for stream in sources]
        free = [i for i, s in enumerate(self._streams) if s.owner is None]
        targets = sorted([*sources, *free])[: len(sources)]
        for stream in sources:
            assert not self._streams[stream].reusable
            self._streams[stream].owner = None
        ops: list[KvOp] = []
        for sequence, dst, scope in zip(waiting, targets, scopes, strict=True):
            ops += self._give(dst, sequence, [], scope)
            if dst not in sources:
                ops.append(Trim(dst, 0))
        return tuple(ops)

    def release(self, sequence: int) -> None:
        """The sequence ended: its stream's reusable tokens stay for the next prompt that
        starts with them (its cells are trimmed when a sequence takes the stream)."""
        s = self._streams[self._stream_of.pop(sequence)]
        s.owner = None
        if not self.reuse:
            s.reusable = []

    def moves(self, decoding: set[int]) -> tuple[KvOp, ...]:
        """While a free stream lies below a decoding one, the sequence in the highest decoding
        stream moves into the lowest free one. ``decoding``: the sequences that decode this
        step (streams still prefilling stay where they are)."""
        ops: list[KvOp] = []
        live = {self._stream_of[s] for s in decoding}
        while live:
            free = [i for i, s in enumerate(self._streams) if s.owner is None]
            top = max(live)
            if not free or free[0] > top:
                break
            dst = free[0]
            src = self._streams[top]
            sequence = src.owner
            assert sequence is not None
            src.owner = None  # it keeps its cells: the same tokens, reusable
            ops += self._lost(dst, [])
            ops.append(Copy(top, dst))
            ops += self._give(dst, sequence, list(src.reusable), src.scope)
            if not self.reuse:
                src.reusable = []
            live.discard(top)
            live.add(dst)
        return tuple(ops)

    def lowest_free(self) -> int:
        return next(i for i, s in enumerate(self._streams) if s.owner is None)

    def _give(self, stream: int, sequence: int, reusable: list[int], scope: bytes) -> list[KvOp]:
        """A free stream goes to a sequence, to hold ``reusable`` (what the operations that
        come with it leave there). The one place where a stream is given: what it kept after
        its last sequence ended, beyond ``reusable``, is lost here (a ``Save`` of it first,
        unless a copy into the stream, which comes with its own, was already planned)."""
        s = self._streams[stream]
        ops = self._lost(stream, reusable)
        s.owner, s.reusable, s.scope = sequence, reusable, scope
        self._stream_of[sequence] = stream
        return ops

    def _lost(self, stream: int, keeps: list[int]) -> list[KvOp]:
        """A ``Save`` of what the free ``stream`` kept, when it is worth keeping and would be
        lost by keeping only ``keeps`` of it; then the stream is marked as keeping only that
        much (so a second call saves nothing)."""
        s = self._streams[stream]
        lost = len(s.reusable) > len(keeps) or s.reusable[: len(keeps)] != keeps
        if self.save_from is None or not lost or len(s.reusable) < self.save_from:
            return []
        op = Save(stream, tuple(s.reusable), s.scope)
        common = _common_prefix(s.reusable, keeps, len(keeps))
        del s.reusable[common:]
        return [op]


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if n >= limit or x != y:
            break
        n += 1
    return n
