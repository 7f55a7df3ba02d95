"""A planned batch's groups of lines spread over the workers' lanes (issue 42 items 2 and 3).

With prefix-aware placement on (``GPUQ_PREFIX_ROUTING``, ``gpuq.jobs.prefix_routing``), a
batch's generation lines that share a start go to one worker's lane, so the fleet computes
each start about once instead of once per worker that takes a line of it. The API does not
tokenise a batch's lines, so the groups come from the planner's byte chains
(``gpuq.batches.planning.plan_chain``), not from the workers' token blocks: lines are sorted by
chain (a depth-first walk of their trie) and cut where neighbours share fewer than
``MIN_SHARED_BLOCKS`` blocks; a group heavier than a worker's even share of the prompt bytes is
cut again at its shallowest split (where its subtrees part), so a start that all lines share (a
system prompt) does not pile the whole batch on one worker. A group whose start a worker's
cache already holds (a cron run's families, the day after; the caller looks it up in the
workers' prefix index) goes to that worker while its share allows; the other groups go to the
workers heaviest first, each to the worker with the fewest prompt bytes so far. Lines in no
group (a start of their own) stay in the shared queues. Pure: tested without Redis.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from gpuq.batches.planning import KEY_BYTES, PlannedLine

MIN_SHARED_BLOCKS = 2  # 256 bytes, about 64 tokens: the API's least start placed by prefix (4 blocks of 16)


def _common(a: bytes, b: bytes) -> int:
    n = 0
    for at in range(0, min(len(a), len(b)), KEY_BYTES):
        if a[at : at + KEY_BYTES] != b[at : at + KEY_BYTES]:
            break
        n += 1
    return n


def groups(lines: Sequence[PlannedLine], *, share: int) -> list[list[PlannedLine]]:
    """Lines that share a start of ``MIN_SHARED_BLOCKS`` blocks or more, in groups no heavier
    than ``share`` prompt bytes where the trie allows (a single start heavier stays whole)."""
    ordered = sorted(lines, key=lambda line: (line.chain, line.key))
    out: list[list[PlannedLine]] = []

    def cut(run: list[PlannedLine], links: list[int]) -> None:
        """``links[i]``: the blocks ``run[i]`` shares with ``run[i + 1]``."""
        if len(run) < 2:
            return
        weight = sum(line.weight for line in run)
        shallowest = min(links)
        if weight <= share or shallowest >= max(links):  # light enough, or one start all the way
            out.append(run)
            return
        start = 0
        for i, link in enumerate(links):
            if link == shallowest:
                cut(run[start : i + 1], links[start:i])
                start = i + 1
        cut(run[start:], links[start:])

    run = ordered[:1]
    links: list[int] = []
    for previous, line in itertools.pairwise(ordered):
        shared = _common(previous.chain, line.chain)
        if shared >= MIN_SHARED_BLOCKS:
            run.append(line)
            links.append(shared)
        else:
            cut(run, links)
            run, links = [line], []
    cut(run, links)
    return out


Holders = Callable[[list[list[PlannedLine]]], list[str | None]]


def spread(lines: Sequence[PlannedLine], workers: Sequence[str], holders: Holders | None = None) -> dict[int, str]:
    """Each grouped line's worker (by line key). With ``holders`` (each group's worker whose
    cache holds its start, or None), a group first goes to its holder while that worker's
    prompt bytes stay within its even share of the batch, or it has the fewest (the load
    guard); every other group,
    heaviest first, to the worker with the fewest prompt bytes so far. Empty with fewer than
    two workers."""
    if len(workers) < 2:
        return {}
    share = max(1, sum(line.weight for line in lines) // len(workers))
    load = dict.fromkeys(sorted(workers), 0)
    found = sorted(groups(lines, share=share), key=lambda g: -_weight(g))
    held = holders(found) if holders is not None and found else [None] * len(found)
    placed: dict[int, str] = {}
    rest = []
    for group, holder in zip(found, held, strict=True):
        if holder in load and (load[holder] + _weight(group) <= share or load[holder] == min(load.values())):
            load[holder] += _weight(group)
            placed.update(dict.fromkeys((line.key for line in group), holder))
        else:
            rest.append(group)
    for group in rest:
        worker = min(load, key=lambda w: (load[w], w))
        load[worker] += _weight(group)
        placed.update(dict.fromkeys((line.key for line in group), worker))
    return placed


def _weight(group: list[PlannedLine]) -> int:
    return sum(line.weight for line in group)
