"""The planner of a batch's queue order (gpuq/batches/planning.py), on plain byte strings."""

import random

from gpuq.batches.planning import BLOCK_BYTES, KEY_BYTES, PLAN_BLOCKS, PlannedLine, plan, plan_chain

BLOCK = BLOCK_BYTES


def text(seed: int, n: int) -> bytes:
    rng = random.Random(seed)
    return bytes(rng.randrange(256) for _ in range(n))


def line(key: int, prompt: bytes) -> PlannedLine:
    return PlannedLine(key, plan_chain(prompt), len(prompt))


def families(n_families: int, per_family: int, start_blocks: int = 28) -> tuple[list[PlannedLine], dict[int, int]]:
    """W3's shape: each family its own start, one question per line, the families interleaved
    as a batch file often has them. Returns the lines and each key's family."""
    lines, family_of = [], {}
    for q in range(per_family):
        for f in range(n_families):
            key = q * n_families + f
            lines.append(line(key, text(f, start_blocks * BLOCK) + text(1000 + key, 20)))
            family_of[key] = f
    return lines, family_of


def runs(order: list[int], family_of: dict[int, int]) -> list[int]:
    """The families in queue order, each run of one family once."""
    out: list[int] = []
    for key in order:
        if not out or out[-1] != family_of[key]:
            out.append(family_of[key])
    return out


def test_one_slot_queues_each_start_s_lines_together_depth_first_in_the_order_the_file_gives_them():
    lines, family_of = families(8, 8)
    p = plan(lines, slots=1)
    assert sorted(p.order) == list(range(64))  # every line once
    assert runs(p.order, family_of) == list(range(8))  # each family in one run, first seen first
    for f in range(8):  # a family's lines in file order
        keys = [k for k in p.order if family_of[k] == f]
        assert keys == sorted(keys)
    assert (p.lines, p.groups, p.slots) == (64, 8, 1)


def test_lines_sharing_the_longest_start_sit_next_to_each_other():
    common = text(1, 10 * BLOCK)
    branch_a, branch_b = text(2, 6 * BLOCK), text(3, 6 * BLOCK)
    prompts = {
        0: common + branch_a + text(10, 5),
        1: common + branch_b + text(11, 5),
        2: common + text(12, 40),  # shares only the common part
        3: common + branch_a + text(13, 5),
        4: common + branch_b + text(14, 5),
        5: common + branch_a + text(15, 5),
    }
    p = plan([line(k, v) for k, v in prompts.items()], slots=1)
    # The common start first seen at line 0: its branch a (lines 0, 3, 5) before branch b (1, 4),
    # then line 2, which shares only the common start, where the file first has it.
    assert p.order == [0, 3, 5, 1, 4, 2]
    assert p.groups == 3  # branch a, branch b, and the common start (line 2's longest shared start)


def test_the_first_lines_of_a_plan_are_as_many_different_starts_as_the_workers_have_slots():
    """A worker takes K jobs at once when it starts: K lines of one start would each compute
    it. The next families' first lines go ahead, and each family's other lines come once its
    first line is K places behind (its start computed by then), one after the other."""
    lines, family_of = families(8, 8)
    p = plan(lines, slots=4)
    assert p.slots == 4
    assert [family_of[k] for k in p.order[:4]] == [0, 1, 2, 3]
    # Then family 0's other lines, 1's, 2's, 3's; each next family's first line three places
    # before the family before it ends.
    assert runs(p.order, family_of) == [0, 1, 2, 3, 0, 1, 2, 3, 4, 3, 4, 5, 4, 5, 6, 5, 6, 7, 6, 7]
    assert_starts_ahead(p.order, family_of, 4)


def assert_starts_ahead(order: list[int], family_of: dict[int, int], slots: int) -> None:
    first: dict[int, int] = {}
    for at, key in enumerate(order):
        family = family_of[key]
        if family in first:
            assert at - first[family] >= slots, f"line {key} only {at - first[family]} places after its start"
        else:
            first[family] = at


def test_starts_go_ahead_by_the_slots_of_all_the_workers():
    lines, family_of = families(8, 4)
    for slots in (2, 3, 5, 8):
        p = plan(lines, slots=slots)
        assert sorted(p.order) == list(range(32))
        assert_starts_ahead(p.order, family_of, slots)


def test_lines_that_share_nothing_fill_the_places_before_a_start_is_reused():
    start = text(1, 6 * BLOCK)
    family = [line(k, start + text(10 + k, BLOCK)) for k in range(4)]
    singles = [line(k, text(20 + k, 3 * BLOCK)) for k in range(4, 7)]
    assert plan(family + singles, slots=4).order == [0, 4, 5, 6, 1, 2, 3]


def test_with_no_new_start_left_a_line_goes_in_rather_than_wait():
    """One start for every line (a shared system prompt, W2's shape): nothing can go ahead."""
    start = text(1, 6 * BLOCK)
    lines = [line(k, start + text(10 + k, BLOCK)) for k in range(6)]
    assert plan(lines, slots=4).order == list(range(6))


def test_a_line_waits_for_the_line_that_computes_the_most_it_reuses():
    """A long start shared by all, then two sub-families: a sub-family's lines wait for its own
    first line, which shares the long start with line 0 (computed by then: it went first)."""
    common = text(1, 10 * BLOCK)
    sub = [text(2, 4 * BLOCK), text(3, 4 * BLOCK)]
    fresh = [line(k, text(50 + k, 2 * BLOCK)) for k in range(10, 14)]
    lines = [line(k, common + sub[k // 5] + text(100 + k, BLOCK)) for k in range(10)] + fresh
    p = plan(lines, slots=3)
    # 0 computes the common start and sub-family a; 1 to 4 wait 3 places (fresh 10, 11 go
    # ahead); 5 starts sub-family b, reusing the common start computed by 0 long before; 6 to 9
    # wait for 5 (fresh 12, 13 go ahead).
    assert p.order == [0, 10, 11, 1, 2, 3, 4, 5, 12, 13, 6, 7, 8, 9]


def test_lines_that_share_nothing_keep_file_order():
    lines = [line(k, text(k, 3 * BLOCK)) for k in range(20)]
    p = plan(lines, slots=4)
    assert p.order == list(range(20))
    assert (p.groups, p.slots, p.shared_bytes) == (0, 0, 0)


def test_keys_are_returned_not_positions_and_file_order_is_the_keys_order():
    # keys are line numbers: sparse, and given here out of order
    a, b = text(1, 2 * BLOCK), text(2, 2 * BLOCK)
    lines = [line(30, b + b"1"), line(7, a + b"2"), line(12, b + b"3"), line(3, a + b"4")]
    assert plan(lines, slots=1).order == [3, 7, 12, 30]


def test_identical_prompts_are_one_group_and_short_prompts_no_group():
    same = text(5, 3 * BLOCK + 2)
    lines = [line(0, same), line(1, text(6, 10)), line(2, same), line(3, text(7, 10))]
    p = plan(lines, slots=1)
    assert p.order == [0, 2, 1, 3]
    assert p.groups == 1
    assert p.shared_bytes == 2 * 3 * BLOCK  # three whole blocks each


def test_figures():
    lines, _ = families(4, 3, start_blocks=10)
    p = plan(lines, slots=8)
    assert p.lines == 12 and p.groups == 4
    assert p.slots == 8
    assert p.prompt_bytes == 12 * (10 * BLOCK + 20)
    assert p.shared_bytes == 12 * 10 * BLOCK  # the family's start (the question is less than a block)
    assert plan([], slots=4).order == []


def test_a_chain_names_each_whole_block_s_start_and_is_cut_short():
    prompt = text(9, (PLAN_BLOCKS + 3) * BLOCK + 5)
    chain = plan_chain(prompt)
    assert len(chain) == PLAN_BLOCKS * KEY_BYTES
    other = prompt[:BLOCK] + bytes([prompt[BLOCK] ^ 1]) + prompt[BLOCK + 1 :]
    assert plan_chain(other)[:KEY_BYTES] == chain[:KEY_BYTES]  # the same first block
    assert plan_chain(other)[KEY_BYTES:] != chain[KEY_BYTES:]  # every key after it names the whole start
    assert plan_chain(prompt[: BLOCK - 1]) == b""  # no whole block


def test_a_batch_of_50000_lines_over_500_starts():
    lines = []
    starts = [text(s, 8 * BLOCK) for s in range(500)]
    rng = random.Random(0)
    for key in range(50_000):
        lines.append(line(key, starts[rng.randrange(500)] + key.to_bytes(4, "little")))
    p = plan(lines, slots=8)
    assert sorted(p.order) == list(range(50_000))
    assert p.groups == 500 and p.slots == 8
