"""A step's plan, as data, without llama.cpp."""

from worker.decoding.plan import N_BATCH, Chunk, Live, Row, Throwaway, ThrowawayRows, chunk_end, plan_step

C = 64


def live(id, stream, *, prompt_len=10, fed=10, pending=None, position=10, admitted=None):
    return Live(id, stream, admitted if admitted is not None else id, prompt(prompt_len, id), fed, pending, position)


def prompt(n, id=0):
    """A prompt of n tokens, its own for each sequence id."""
    return [100 * id + i for i in range(n)]


def test_every_decoding_sequence_gets_one_row_in_stream_order():
    plan = plan_step([live(1, 2, pending=7, position=12), live(2, 0, pending=5, position=30)], chunk_tokens=C)
    assert plan.rows == (Row(2, 0, 5, 30), Row(1, 2, 7, 12))
    assert plan.chunks == ()


def test_a_prompt_goes_in_at_fixed_boundaries_whatever_was_reused_before_it():
    # 64 tokens came from the cache: the next chunk is [64, 128), never [64, 64 + anything else).
    plan = plan_step([live(1, 0, prompt_len=300, fed=64)], chunk_tokens=C)
    assert [(c.start, c.end) for c in plan.chunks] == [(64, 128), (128, 192), (192, 256), (256, 300)]
    assert [c.last for c in plan.chunks] == [False, False, False, True]
    assert chunk_end(130, 300, C) == 192 and chunk_end(256, 300, C) == 300


def test_while_others_decode_a_step_takes_one_chunk_oldest_prompt_first():
    plan = plan_step(
        [
            live(1, 0, pending=3, position=40),
            live(2, 1, prompt_len=200, fed=0, admitted=5),
            live(3, 2, prompt_len=50, fed=0, admitted=4),
        ],
        chunk_tokens=C,
    )
    assert len(plan.rows) == 1
    assert plan.chunks == (Chunk(3, 2, 0, 50, True),)


def test_with_nothing_decoding_chunks_fill_the_batch():
    plan = plan_step([live(1, 0, prompt_len=2000, fed=0)], chunk_tokens=C)
    assert plan.prompt_tokens == N_BATCH
    assert all(c.end - c.start == C for c in plan.chunks)


def test_a_chunk_is_never_split_to_fit_what_is_left():
    plan = plan_step(
        [live(1, 0, prompt_len=500, fed=0, admitted=1), live(2, 1, prompt_len=60, fed=0, admitted=2)],
        chunk_tokens=C,
    )
    # The first prompt takes 500 of the 512 tokens; the second's 60 do not fit in the 12 left
    # and wait whole for the next step.
    assert [c.sequence for c in plan.chunks] == [1] * 8 and plan.prompt_tokens == 500


def test_unaligned_chunks_start_where_reuse_ended_never_leave_one_token_alone_nor_pass_c_rows():
    assert chunk_end(7, 300, C, aligned=False) == 7 + C
    assert chunk_end(0, C + 1, C, aligned=False) == C - 1  # not [0, C) then a one-row [C, C + 1)
    assert chunk_end(C - 1, C + 1, C, aligned=False) == C + 1
    assert chunk_end(0, C + 2, C, aligned=False) == C
    assert chunk_end(0, 3, 2, aligned=False) == 3  # two rows and one left: the last one taken along
    plan = plan_step([live(1, 0, prompt_len=C + 1, fed=0)], chunk_tokens=C, aligned=False)
    assert [(c.start, c.end, c.last) for c in plan.chunks] == [(0, C - 1, False), (C - 1, C + 1, True)]


def test_while_others_decode_a_short_prompt_goes_in_a_token_a_step_beside_their_rows():
    decoding = [live(i, i, pending=3, position=40) for i in range(1, 5)]  # four decode rows
    sequences = [
        *decoding,
        live(5, 4, prompt_len=30, fed=24, admitted=5),  # six tokens left: beside
        live(6, 5, prompt_len=30, fed=0, admitted=6),  # thirty: a chunk of its own
        live(7, 6, prompt_len=2, fed=0, admitted=7),  # two, but one beside row per four decode rows
    ]
    plan = plan_step(sequences, chunk_tokens=C, aligned=False, short_tail=8)
    assert len(plan.rows) == 4
    assert plan.beside == (Chunk(5, 4, 24, 25, False),)
    assert plan.chunks == (Chunk(6, 5, 0, 30, True),)  # the waiting short one is never chunked
    last = plan_step([*decoding, live(5, 4, prompt_len=30, fed=29)], chunk_tokens=C, aligned=False, short_tail=8)
    assert last.beside == (Chunk(5, 4, 29, 30, True),) and last.prompt_tokens == 1  # its first token comes next
    eight = [live(i, i, pending=3, position=40) for i in range(1, 9)]
    two = plan_step(
        [*eight, live(9, 8, prompt_len=3, fed=0), live(10, 9, prompt_len=3, fed=0)], chunk_tokens=C, short_tail=8
    )
    assert [c.sequence for c in two.beside] == [9, 10]


def test_short_prompts_go_in_by_passes_of_their_own_when_nothing_decodes_or_the_decoder_says_not():
    alone = plan_step([live(1, 0, prompt_len=5, fed=0)], chunk_tokens=C, aligned=False, short_tail=8)
    assert alone.beside == () and alone.chunks == (Chunk(1, 0, 0, 5, True),)
    decoding = live(2, 1, pending=3, position=40)
    off = plan_step([decoding, live(1, 0, prompt_len=5, fed=0)], chunk_tokens=C, aligned=False)
    assert off.beside == () and off.chunks == (Chunk(1, 0, 0, 5, True),)
    echo = Live(3, 2, 3, prompt(5), 0, None, 5, prompt_logits=True)  # every prompt row's logits: its own passes
    assert plan_step([decoding, echo], chunk_tokens=C, aligned=False, short_tail=8).beside == ()


def test_the_prompt_nearest_the_decode_rows_goes_beside_them_first():
    decoding = [live(i, i, pending=3, position=40) for i in range(4)]  # streams 0 to 3
    older_higher, newer_lower = live(4, 6, prompt_len=3, admitted=4, fed=0), live(5, 4, prompt_len=3, admitted=5, fed=0)
    plan = plan_step([*decoding, older_higher, newer_lower], chunk_tokens=C, aligned=False, short_tail=8)
    assert plan.beside == (Chunk(5, 4, 0, 1, False),)  # stream 4 adjoins the rows; 6 would need 5 filled


def test_a_step_is_decoded_as_batches_the_decode_rows_first_then_each_chunk_in_a_pass_of_its_own():
    plan = plan_step(
        [live(1, 0, pending=7, position=12), live(2, 1, prompt_len=62, fed=0), live(3, 2, prompt_len=3, fed=0)],
        chunk_tokens=C,
    )
    rows, first = plan.batches
    assert rows.rows == ((7, 12, 0, True),) and rows.decode == ((Row(1, 0, 7, 12), 0),) and rows.chunk is None
    # A chunk's worth of prompt tokens a step while others decode: the second prompt waits.
    assert first.chunk == Chunk(2, 1, 0, 62, True)
    assert first.rows == tuple((200 + p, p, 1, p == 61) for p in range(62))  # logits: its last row only
    assert first.decode == () and first.counted == 62


def test_with_throwaway_rows_the_decode_rows_streams_are_one_unbroken_run():
    """Flash attention: a stream between decode rows that has none (it prefills) gets a row
    after its last cell, not counted as a sequence's; the batch stays in stream order."""
    rule = ThrowawayRows(ends=(41, 30, 13, 0), n_ctx_per_seq=1024, token=1)
    sequences = [
        live(1, 0, pending=7, position=40),
        live(2, 1, prompt_len=200, fed=30),
        live(3, 2, pending=8, position=12),
    ]
    plan = plan_step(sequences, chunk_tokens=C, throwaway=rule)
    rows = plan.batches[0]
    assert plan.throwaway == rows.throwaway == (Throwaway(1, 30),)
    assert rows.rows == ((7, 40, 0, True), (1, 30, 1, False), (8, 12, 2, True))
    assert [place for _row, place in rows.decode] == [0, 2] and rows.counted == 2
    assert plan_step(sequences, chunk_tokens=C).batches[0].throwaway == ()  # without flash attention: none


def test_a_lone_decode_row_gets_a_neighbour_below_the_last_stream_above_any_other():
    rule = ThrowawayRows(ends=(41, 0, 0), n_ctx_per_seq=1024, token=1)
    assert plan_step([live(1, 0, pending=7, position=40)], chunk_tokens=C, throwaway=rule).throwaway == (
        Throwaway(1, 0),
    )
    rule = ThrowawayRows(ends=(5, 9, 41), n_ctx_per_seq=1024, token=1)
    assert plan_step([live(1, 2, pending=7, position=40)], chunk_tokens=C, throwaway=rule).throwaway == (
        Throwaway(1, 9),
    )
    full = ThrowawayRows(ends=(41, 64), n_ctx_per_seq=64, token=1)  # a stream whose context is full: no row
    assert plan_step([live(1, 0, pending=7, position=40)], chunk_tokens=C, throwaway=full).throwaway == ()


def test_a_prompt_row_beside_the_decode_rows_is_in_their_pass_at_its_place():
    decoding = [live(i, i, pending=3, position=40) for i in range(1, 5)]
    plan = plan_step([*decoding, live(5, 5, prompt_len=30, fed=24)], chunk_tokens=C, aligned=False, short_tail=8)
    (rows,) = plan.batches
    assert rows.beside == ((Chunk(5, 5, 24, 25, False), 4),)
    assert rows.rows[4] == (524, 24, 5, False) and rows.counted == 5
