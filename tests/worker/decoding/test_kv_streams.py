"""Which KV stream a sequence takes and what it reuses, as data, without llama.cpp."""

import pytest

from worker.decoding.kv_streams import Copy, KvStreams, Save, Trim

C = 4  # chunk tokens, small so the cases read easily


def tokens(n, start=0):
    return list(range(start, start + n))


def test_a_first_prompt_takes_the_lowest_stream_and_reuses_nothing():
    kv = KvStreams(3, chunk_tokens=C)
    placed = kv.place(1, tokens(10))
    assert (placed.stream, placed.reused, placed.ops) == (0, 0, (Trim(0, 0),))


def test_only_whole_prefill_chunks_are_reused_and_never_the_last_prompt_token():
    kv = KvStreams(2, chunk_tokens=C)
    kv.place(1, tokens(10))
    kv.computed(1, tokens(8))  # two whole chunks; the partial [8, 10) is not reusable
    kv.release(1)
    # Shares 9 tokens: 8 of them (two chunks) are reused, from its own stream (no copy).
    again = kv.place(2, [*tokens(9), 99])
    assert (again.stream, again.reused, again.ops) == (0, 8, (Trim(0, 8),))
    kv.release(2)
    # A prompt that is exactly the 8 cached tokens decodes its last chunk again, for its logits.
    assert kv.place(3, tokens(8)).reused == 4


def test_a_live_streams_start_is_copied_into_the_lowest_free_stream():
    kv = KvStreams(3, chunk_tokens=C)
    kv.place(1, tokens(12))
    kv.computed(1, tokens(12))
    placed = kv.place(2, [*tokens(9), 70, 71])
    assert (placed.stream, placed.reused) == (1, 8)
    assert placed.ops == (Copy(0, 1), Trim(1, 8))


def test_the_longest_shared_start_wins_and_the_target_wins_a_tie():
    kv = KvStreams(3, chunk_tokens=C)
    for seq, prefix in ((1, tokens(8)), (2, [*tokens(4), 50, 51, 52, 53])):
        placed = kv.place(seq, [*prefix, 9, 9, 9])
        kv.computed(seq, prefix[placed.reused :])
    kv.release(1)
    kv.release(2)
    placed = kv.place(3, [*tokens(4), 50, 51, 52, 53, 7])
    assert (placed.stream, placed.reused, placed.ops) == (0, 8, (Copy(1, 0), Trim(0, 8)))
    kv.release(3)
    tie = kv.place(4, [*tokens(4), 60, 61, 62, 63, 5])  # 4 shared with every stream
    assert (tie.stream, tie.reused, tie.ops) == (0, 4, (Trim(0, 4),))


def test_with_reuse_off_every_prompt_starts_empty():
    kv = KvStreams(2, chunk_tokens=C, reuse=False)
    kv.place(1, tokens(12))
    kv.computed(1, tokens(12))
    kv.release(1)
    assert kv.place(2, tokens(12)).reused == 0


def test_a_fork_copies_its_parents_stream():
    kv = KvStreams(3, chunk_tokens=C)
    kv.place(1, tokens(6))
    kv.computed(1, tokens(4))
    child = kv.fork(1, 2)
    assert (child.stream, child.ops) == (1, (Copy(0, 1),))
    assert kv.owner(1) == 2 and kv.stream_of(2) == 1 and kv.holds(1) == tokens(4)


def test_decoding_sequences_move_down_and_the_stream_they_leave_keeps_its_tokens():
    kv = KvStreams(4, chunk_tokens=C)
    for seq in range(4):
        kv.place(seq, tokens(6, start=10 * seq))
        kv.computed(seq, tokens(4, start=10 * seq))
    kv.release(0)
    kv.release(1)
    ops = kv.moves({2, 3})
    assert ops == (Copy(3, 0), Copy(2, 1))
    assert [kv.owner(s) for s in range(4)] == [3, 2, None, None]
    assert (kv.stream_of(3), kv.stream_of(2)) == (0, 1)
    assert kv.holds(3) == tokens(4, start=30)  # still reusable where it was
    with pytest.raises(StopIteration):
        full = KvStreams(1, chunk_tokens=C)
        full.place(1, tokens(3))
        full.place(2, tokens(3))


def test_a_prefilling_sequence_is_not_moved_and_does_not_block_others():
    kv = KvStreams(3, chunk_tokens=C)
    for seq in range(3):
        kv.place(seq, tokens(6, start=10 * seq))
    kv.release(0)
    assert kv.moves({2}) == (Copy(2, 0),)  # stream 1 still prefills
    assert kv.stream_of(2) == 0 and kv.stream_of(1) == 1


def test_with_any_prefix_all_but_the_last_two_prompt_tokens_can_be_reused():
    kv = KvStreams(2, chunk_tokens=C, any_prefix=True)
    kv.place(1, tokens(10))
    kv.computed(1, tokens(10))  # every prompt token computed in a pass of several rows
    kv.release(1)
    # Shares 7 tokens: all 7 are reused, not only the chunk boundary at 4.
    assert kv.place(2, [*tokens(7), 99, 98, 97]).reused == 7
    kv.computed(2, [99, 98, 97])
    kv.release(2)
    # A prompt it holds whole: its last two tokens are decoded again (its logits; no one-row pass).
    assert kv.place(3, [*tokens(7), 99, 98, 97]).reused == 8
    kv.release(3)
    assert kv.place(4, tokens(2)).reused == 0


def test_prompts_not_begun_take_the_lowest_streams_free_ones_included_oldest_first():
    """Nothing is in their streams yet, so they move without a copy; a free stream they take
    is emptied (its kept tokens go, as when a new prompt takes it) and the ones they leave are free."""
    kv = KvStreams(6, chunk_tokens=C, any_prefix=True)
    for seq in range(6):
        kv.place(seq, tokens(6, start=10 * seq))
    for seq in (0, 1):  # decoding sequences: their prompts are in
        kv.computed(seq, tokens(4, start=10 * seq))
    kv.computed(3, tokens(4, start=30))
    kv.release(3)  # kept, free, between the decoding streams and the prompts not begun
    kv.release(2)  # free and empty
    ops = kv.order_waiting([5, 4])  # sequence 5 is the older of the two
    assert ops == (Trim(2, 0), Trim(3, 0))
    assert [kv.owner(s) for s in range(6)] == [0, 1, 5, 4, None, None]
    assert (kv.stream_of(5), kv.stream_of(4)) == (2, 3)
    assert kv.holds(3) == [] and kv.free == 2
    assert kv.order_waiting([5, 4]) == ()  # already lowest and oldest first: nothing to do


def test_a_start_restored_into_a_free_stream_is_reused_from_there():
    """The prefix cache's restore (kv_state) writes a free stream's cells; KvStreams is told
    which tokens they are, and the next prompt starting with them takes them."""
    kv = KvStreams(3, chunk_tokens=C)
    kv.restored(2, tokens(8))
    placed = kv.place(1, [*tokens(8), 50, 51])
    assert (placed.stream, placed.reused, placed.ops) == (0, 8, (Copy(2, 0), Trim(0, 8)))
    with pytest.raises(AssertionError):
        kv.restored(0, tokens(4))  # the live sequence's stream


def test_a_prompt_reuses_only_streams_of_its_own_scope():
    """A tenant's prompt never reuses another tenant's cells, even its very start: the time it
    would save would tell the tenant how another's prompts begin."""
    kv = KvStreams(2, chunk_tokens=C, any_prefix=True)
    kv.place(1, tokens(10), scope=b"tenant a")
    kv.computed(1, tokens(8))
    kv.release(1)
    assert kv.best_reuse(tokens(10), b"tenant b") == 0
    assert kv.best_reuse(tokens(10), b"tenant a") == 8
    assert kv.place(2, tokens(10), scope=b"tenant b").reused == 0


def test_with_saves_on_what_a_free_stream_kept_is_saved_before_it_is_lost():
    """With the prefix cache on, each operation that overwrites a free stream's kept tokens
    comes after a Save of them (in their scope); tokens kept in place, or too few, are not saved."""
    kv = KvStreams(2, chunk_tokens=C, any_prefix=True, save_from=6)
    kv.place(1, tokens(10, start=100), scope=b"a")
    kv.computed(1, tokens(8, start=100))
    kv.release(1)
    # Another prompt takes stream 0: its 8 kept tokens are saved, then trimmed away.
    placed = kv.place(2, tokens(10, start=200), scope=b"a")
    assert placed.ops == (Save(0, tuple(tokens(8, start=100)), b"a"), Trim(0, 0))
    kv.computed(2, tokens(8, start=200))
    kv.release(2)
    # A prompt that reuses all it kept loses nothing: no save.
    again = kv.place(3, [*tokens(8, start=200), 1, 2, 3], scope=b"a")
    assert again.ops == (Trim(0, 8),)
    # ... and one that reuses part of it loses the rest: the whole start is saved first.
    kv.computed(3, [1, 2, 3])
    kv.release(3)
    part = kv.place(4, [*tokens(6, start=200), 9, 9, 9], scope=b"a")
    assert part.ops == (Save(0, (*tokens(8, start=200), 1, 2, 3), b"a"), Trim(0, 6))
    # A stream reclaimed for a restore, and every free stream when the context closes.
    kv.computed(4, [9, 9, 9])
    kv.release(4)
    assert kv.reclaim(0) == (Save(0, (*tokens(6, start=200), 9, 9, 9), b"a"),)
    assert kv.holds(0) == [] and kv.reclaim(0) == ()
    kv.restored(1, tokens(7, start=300), b"b")
    assert kv.kept() == (Save(1, tuple(tokens(7, start=300)), b"b"),)


def test_with_saves_on_a_copy_into_a_free_stream_saves_what_it_kept_first():
    kv = KvStreams(3, chunk_tokens=C, any_prefix=True, save_from=4)
    for seq in range(3):
        kv.place(seq, tokens(6, start=10 * seq), scope=b"a")
        kv.computed(seq, tokens(5, start=10 * seq))
    kv.release(0)
    # Sequence 2 moves down into stream 0: what stream 0 kept is saved before the copy.
    assert kv.moves({1, 2}) == (Save(0, tuple(tokens(5)), b"a"), Copy(2, 0))
    assert kv.holds(0) == tokens(5, start=20) and kv.scope_of(0) == b"a"
