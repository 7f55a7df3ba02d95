"""The order a batch's generation lines are queued in: lines that share a start side by side.

gpuq sees every line of a batch before any runs. A worker reuses a prompt's start from a KV
stream (live or kept) or from its prefix cache's RAM tier, but only a start that is already
computed when the prompt is admitted: lines admitted together each compute their start, and a
start whose lines are spread over the whole file is computed again once it has left the
streams. So the queue order decides how often each start is computed.

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
- **Lanes.** The walk is cut into ``lanes`` contiguous pieces of about equal prompt size
  (a worker's slots, K), each cut moved, within half a lane's share, to where neighbours share
  the least; the lanes are then merged, always taking the next line of the lane that has had
  the least prompt queued (so a lane of long prompts, whose starts cost the most to compute
  twice, is the one whose lines come furthest apart). The first K lines a worker takes, all at once when it
  starts, are so K different starts, each computed once; the next line of a lane comes about
  K lines later, when its start has been computed and sits in a stream. Siblings queued
  strictly one after another would be taken together, and each would compute the start.

Pure and synchronous over plain data: tested without Redis, SQL or a model.
"""

from __future__ import annotations

import heapq
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
    weight: int  # its prompt's size (bytes stand for tokens): lanes are balanced by it


@dataclass(frozen=True, slots=True)
class Plan:
    order: list[int]  # the keys, in the order to queue them
    lines: int  # lines planned
    groups: int  # starts shared by two lines or more (each line counted under the longest it shares)
    lanes: int  # lanes the order interleaves (1 when nothing is shared: file order)
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


def plan(lines: Sequence[PlannedLine], *, lanes: int) -> Plan:
    """The queue order of ``lines`` for workers of ``lanes`` slots."""
    lines = sorted(lines, key=lambda line: line.key)  # file order: a line's index is its place in the file
    total = sum(line.weight for line in lines)
    if not lines:
        return Plan([], 0, 0, 0, 0, 0)
    firsts = [line.chain[:KEY_BYTES] for line in lines if line.chain]
    if len(set(firsts)) == len(firsts):  # no two lines share a first block (a quick look: most batches)
        return _file_order(lines, total)
    root = _trie(lines)
    walk, shared_depth, groups = _walk(root, len(lines))
    shared = sum(min(d * BLOCK_BYTES, lines[i].weight) for i, d in enumerate(shared_depth))
    if groups == 0:
        return _file_order(lines, total)
    lanes = max(1, min(lanes, len(lines)))
    weights = [max(1, lines[i].weight) for i in walk]
    between = [0] + [_common_blocks(lines[a].chain, lines[b].chain) for a, b in itertools.pairwise(walk)]
    pieces = _cut(weights, between, lanes)
    merged = _merge([walk[start:end] for start, end in pieces], [weights[start:end] for start, end in pieces])
    return Plan([lines[i].key for i in merged], len(lines), groups, len(pieces), total, shared)


def _file_order(lines: Sequence[PlannedLine], total: int) -> Plan:
    """Nothing shared: nothing to gain, and file order is what the user expects."""
    return Plan([line.key for line in lines], len(lines), 0, 1, total, 0)


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


def _cut(weights: list[int], between: list[int], lanes: int) -> list[tuple[int, int]]:
    """The walk cut into ``lanes`` non-empty contiguous pieces of about equal weight. Each cut
    goes where its neighbours share the fewest blocks (``between[c]``: lines ``c - 1`` and ``c``)
    within half a lane's share of the even cut, the nearest such place first."""
    n = len(weights)
    before = [0]
    for w in weights:
        before.append(before[-1] + w)
    total = before[-1]
    slack = total / (2 * lanes)
    cuts = [0]
    for k in range(1, lanes):
        goal = total * k / lanes
        low, high = cuts[-1] + 1, n - (lanes - k)  # every piece keeps a line
        if low > high:
            break
        candidates = [c for c in range(low, high + 1) if abs(before[c] - goal) <= slack]
        if not candidates:
            candidates = [min(range(low, high + 1), key=lambda c: abs(before[c] - goal))]
        cuts.append(min(candidates, key=lambda c: (between[c], abs(before[c] - goal), c)))
    cuts.append(n)
    return list(itertools.pairwise(cuts))


def _merge(pieces: list[list[int]], weights: list[list[int]]) -> list[int]:
    """The lanes interleaved: each next line from the lane with the least weight queued so far
    (the lowest lane on a tie), so lanes advance together and their first lines come first."""
    merged: list[int] = []
    heap = [(0, lane, 0) for lane in range(len(pieces))]
    while heap:
        queued, lane, at = heapq.heappop(heap)
        merged.append(pieces[lane][at])
        if at + 1 < len(pieces[lane]):
            heapq.heappush(heap, (queued + weights[lane][at], lane, at + 1))
    return merged
