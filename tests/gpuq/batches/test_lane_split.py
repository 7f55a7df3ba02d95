"""A planned batch's groups spread over workers' lanes: each family of lines on one worker, the
families spread by prompt bytes, a start all lines share not piling them on one worker, lines
with starts of their own left to the shared queues."""

from __future__ import annotations

from gpuq.batches.lane_split import spread
from gpuq.batches.planning import PlannedLine, plan_chain

FAMILY = "Quiz {f}. " + "Here is a worked example of family {f}, as a few-shot start would hold it. " * 8


def line(key: int, prompt: str) -> PlannedLine:
    data = prompt.encode()
    return PlannedLine(key, plan_chain(data), len(data))


def interleaved(families: int, per_family: int, system: str = "") -> list[PlannedLine]:
    return [
        line(q * families + f, system + FAMILY.format(f=f) + f"Question {q}: why?")
        for q in range(per_family)
        for f in range(families)
    ]


def _families(placed: dict[int, str], families: int) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for key, worker in placed.items():
        out.setdefault(key % families, set()).add(worker)
    return out


def test_each_family_goes_to_one_worker_and_the_families_spread_evenly():
    placed = spread(interleaved(8, 8), ["w1", "w2"])
    assert len(placed) == 64
    by_family = _families(placed, 8)
    assert all(len(workers) == 1 for workers in by_family.values())
    assert sorted(w for workers in by_family.values() for w in workers).count("w1") == 4


def test_a_start_every_line_shares_does_not_put_the_batch_on_one_worker():
    system = "You are a careful assistant who answers in one sentence and never more than that. " * 6
    placed = spread(interleaved(8, 8, system), ["w1", "w2"])
    by_family = _families(placed, 8)
    assert all(len(workers) == 1 for workers in by_family.values())
    assert {w for workers in by_family.values() for w in workers} == {"w1", "w2"}


def test_lines_of_their_own_and_a_single_worker_place_nothing():
    own = [line(i, f"Ticket {i}: " + "x" * 600) for i in range(10)]
    assert spread(own, ["w1", "w2"]) == {}
    assert spread(interleaved(4, 4), ["w1"]) == {}
