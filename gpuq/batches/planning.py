"""The order a batch's generation lines are queued in: lines that share a start together.

gpuq sees every line of a batch before any runs. A worker reuses a prompt's start from a KV
stream (live or kept) or from its prefix cache's RAM tier, but only a start that is computed
when the prompt is admitted: lines admitted while their start is still being computed each
compute it again (a worker takes K lines at once when it starts, and one each time a slot
frees). So the queue order decides how often each start is computed.

- **A trie of block chains.** Each line's prompt is named by a chain of block keys: its bytes
  (``queue_order.prompt_bytes``: the text or the token ids it starts with) in blocks of
  ``BLOCK_BYTES``, block ``i``'s key naming the whole start up to its end, at most
  ``PLAN_BLOCKS`` blocks. Not the workers' token blocks (``gpuq.prefix_blocks``): the API does
  not tokenise a batch's lines (llama.cpp's tokenizer takes about 3 ms for a 480-token prompt on
  a CPU core, minutes for a large batch), and two prompts that share their text's start share
  their tokens' start but for the last token or two. The chains are sorted (a sorted list of
  chains is a depth-first walk of their trie) and the trie is built from neighbours' common
  prefixes.
- **Depth first.** Walking that trie gives every start's lines one after another, the lines
  sharing the longest start nearest each other; at each node its subtrees (and the lines that
  end there) in the order the file first has them, so a plan follows the file where it can.
  Each line reuses the most it can from the line before it, and a group's start stays in a
  worker's streams while its lines run (not only in the RAM tier).
- **Starts ahead.** A line that reuses what an earlier line computes comes at least ``slots``
  places after it (the slots of the workers that serve the model): the lines taken in between
  are at most the slots that free while that start is computed (a later prompt's prefill waits
  for an earlier one's, so nothing admitted after it can end before it is in), so the line is
  admitted once its start is there. The places in between go to the next lines that start
  something new (the first line of the next group, or a line that shares nothing), taken out of
  their turn; such a line also goes ``slots - 1`` places early when its turn is that near, so
  the next group's first line is computed while the last lines of the group before it run. Only
  when no such line is left does a line go in early. The first K lines a worker takes at once
  are so K different starts, each computed once, and at most two groups are open at a time.

Pure and synchronous over plain data: tested without Redis, SQL or a model.
"""

from __future__ import annotations

import bisect
import itertools
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

# About 32 tokens a block (prose is 3 to 5 bytes a token): shorter shared starts are not worth
# grouping, and a block costs about 0.2 us to key. A chain is kept to its first PLAN_BLOCKS
# blocks (16 KB of prompt); lines that share more are planned as if they shared only this much.
# A chain takes KEY_BYTES per block, a sixteenth of the prompt's bytes: a 210 MB batch file's
# plan holds 13 MB at most.
BLOCK_BYTES = 128
PLAN_BLOCKS = 128
KEY_BYTES = 8


def plan_chain(prompt: bytes) -> bytes:
    """A prompt's start as the planner compares it: one key per whole block, each naming the
    prompt up to the block's end. Python's own ``hash`` (SipHash, salted per process): the keys
    are compared only within one plan, in one process; two starts get one key once in 2**64,
    and a collision only misplaces a line in the queue."""
    end = min(len(prompt), PLAN_BLOCKS * BLOCK_BYTES) // BLOCK_BYTES * BLOCK_BYTES
    keys = []
    key = 0
    for at in range(0, end, BLOCK_BYTES):
        key = hash((key, prompt[at : at + BLOCK_BYTES]))
        keys.append(key)
    return struct.pack(f"<{len(keys)}q", *keys)


@dataclass(frozen=True, slots=True)
class PlannedLine:
    """A generation line as the planner sees it. ``key``: the caller's name for it (the plan
    returns keys); keys in file order (a lower key came earlier in the file)."""

    key: int
    chain: bytes
    weight: int  # its prompt's size in bytes (for the figures)


@dataclass(frozen=True, slots=True)
class Plan:
    order: list[int]  # the keys, in the order to queue them
    lines: int  # lines planned
    groups: int  # starts shared by two lines or more (each line counted under the longest it shares)
    slots: int  # the slots it was planned for (0 when nothing is shared: file order)
    prompt_bytes: int
    shared_bytes: int  # prompt bytes in whole blocks some other line starts with too


@dataclass(slots=True, eq=False)
class _Node:
    depth: int  # blocks from the start
    lines: list[int] = field(default_factory=list)  # indices of lines whose chain ends here
    children: list[_Node] = field(default_factory=list)
    first: int = 0  # the lowest line index in the subtree
    count: int = 0  # lines in the subtree
    parent: _Node | None = field(default=None, repr=False)


def plan(lines: Sequence[PlannedLine], *, slots: int) -> Plan:
    """The queue order of ``lines`` for workers with ``slots`` slots in all."""
    lines = sorted(lines, key=lambda line: line.key)  # file order: a line's index is its place in the file
    total = sum(line.weight for line in lines)
    if not lines:
        return Plan([], 0, 0, 0, 0, 0)
    firsts = [line.chain[:KEY_BYTES] for line in lines if line.chain]
    if len(set(firsts)) == len(firsts):  # no two lines share a first block (a quick look: most batches)
        return _file_order(lines, total)
    root = _trie(lines)
    walk, shared_depth, groups = _walk(root, len(lines))
    if groups == 0:
        return _file_order(lines, total)
    shared = sum(min(d * BLOCK_BYTES, lines[i].weight) for i, d in enumerate(shared_depth))
    between = [0] + [_common_blocks(lines[a].chain, lines[b].chain) for a, b in itertools.pairwise(walk)]
    order = _starts_ahead(between, max(1, slots))
    return Plan([lines[walk[at]].key for at in order], len(lines), groups, max(1, slots), total, shared)


def _file_order(lines: Sequence[PlannedLine], total: int) -> Plan:
    """Nothing shared: nothing to gain, and file order is what the user expects."""
    return Plan([line.key for line in lines], len(lines), 0, 0, total, 0)


def _trie(lines: Sequence[PlannedLine]) -> _Node:
    """The compressed trie of the lines' chains (a node where chains part, or where one ends),
    built from the chains in sorted order, each with the common prefix of its neighbour."""
    by_chain = sorted(range(len(lines)), key=lambda i: (lines[i].chain, i))
    root = _Node(0)
    stack = [root]
    previous: bytes | None = None
    for i in by_chain:
        chain = lines[i].chain
        if chain == previous:
            stack[-1].lines.append(i)  # the same chain: the same node
            continue
        common = 0 if previous is None else _common_blocks(previous, chain)
        popped: _Node | None = None
        while stack[-1].depth > common:
            popped = stack.pop()
        if stack[-1].depth < common:
            # The previous chain and this one part below the top of the stack: a node there.
            assert popped is not None
            fork = _Node(common, children=[popped])
            stack[-1].children[-1] = fork
            stack.append(fork)
        depth = len(chain) // KEY_BYTES
        if depth == stack[-1].depth:  # this chain ends where the last one forked: only at the root
            stack[-1].lines.append(i)
        else:
            node = _Node(depth, lines=[i])
            stack[-1].children.append(node)
            stack.append(node)
        previous = chain
    _order(root)
    return root


def _order(root: _Node) -> None:
    """Each node's parent, and its subtree's first line and size."""
    post: list[_Node] = []
    pending = [root]
    while pending:
        node = pending.pop()
        post.append(node)
        pending.extend(node.children)
    for node in reversed(post):  # children before parents
        for child in node.children:
            child.parent = node
        node.first = min([*node.lines, *(c.first for c in node.children)])
        node.count = len(node.lines) + sum(c.count for c in node.children)


def _walk(root: _Node, n: int) -> tuple[list[int], list[int], int]:
    """The lines depth first, a node's own lines and its children's subtrees in the order the
    file first has them; for each line the blocks of the longest start it shares with another
    line; and how many such starts there are."""
    walk: list[int] = []
    shared = [0] * n
    groups: set[int] = set()
    pending: list[tuple[_Node | int, _Node | None]] = [(root, None)]  # a subtree, or one line of a node
    while pending:
        item, parent = pending.pop()
        if isinstance(item, int):
            walk.append(item)
            # Its longest shared start: its own node when others end there or below it, else
            # the node above (in a compressed trie every node but the root has two lines below it).
            assert parent is not None
            start = parent if parent.count >= 2 else parent.parent
            if start is not None and start.depth > 0:
                shared[item] = start.depth
                groups.add(id(start))
            continue
        items: list[tuple[int, _Node | int]] = [(i, i) for i in item.lines]
        items += [(child.first, child) for child in item.children]
        items.sort(key=lambda x: x[0])
        pending.extend((entry, item) for _first, entry in reversed(items))
    return walk, shared, len(groups)


def _common_blocks(a: bytes, b: bytes) -> int:
    """How many whole blocks two chains share from the start (a binary search of slices:
    a few comparisons in C, not one per byte in Python)."""
    low, high = 0, min(len(a), len(b)) // KEY_BYTES
    while low < high:
        mid = (low + high + 1) // 2
        if a[: mid * KEY_BYTES] == b[: mid * KEY_BYTES]:
            low = mid
        else:
            high = mid - 1
    return low


def _starts_ahead(between: list[int], slots: int) -> list[int]:
    """The walk's positions in queue order. A line that reuses an earlier line's start
    (``between[at]``: the blocks it shares with the line before it) comes at least ``slots``
    places after the line that computes that start; the places in between go to the next lines
    that start something new (they share nothing with the line before them, so wait for
    nothing), out of their turn. Such a line also goes ``slots - 1`` places early when its turn
    is that near, so the lines that reuse its start need not wait when their turn comes."""
    n = len(between)
    source = _sources(between)
    fresh = [at for at in range(n) if between[at] == 0]
    placed = [-1] * n  # queue place of each walk position, -1 until queued
    order: list[int] = []
    at = 0  # the next walk position in turn
    ahead = 0  # the next of ``fresh`` not queued yet
    while len(order) < n:
        while placed[at] >= 0:
            at += 1
        while ahead < len(fresh) and placed[fresh[ahead]] >= 0:
            ahead += 1
        new = fresh[ahead] if ahead < len(fresh) else at
        src = source[at]
        waits = src is not None and len(order) - placed[src] < slots  # its start may still be computing
        # The lines still to come before ``new`` in turn (those of ``fresh`` that went early do not).
        before_new = new - at - (ahead - bisect.bisect_right(fresh, at))
        take = new if new != at and (waits or before_new < slots) else at
        placed[take] = len(order)
        order.append(take)
    return order


def _sources(between: list[int]) -> list[int | None]:
    """For each walk position, the first position of the run of lines that share with it all
    it reuses from the line before it (the line that computes that start first), or None when it
    reuses nothing: the last earlier position whose line shares less with its own predecessor."""
    source: list[int | None] = [None] * len(between)
    smaller: list[int] = []  # positions whose ``between`` increase from the bottom of the stack up
    for at, shared in enumerate(between):
        while smaller and between[smaller[-1]] >= shared:
            smaller.pop()
        if shared > 0:
            source[at] = smaller[-1] if smaller else 0
        smaller.append(at)
    return source
