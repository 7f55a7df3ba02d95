"""A decoded batch committed, without llama.cpp: the step output's logits and the sequences'
samplers are stand-ins, the plan, the KV streams and the text rules are the real ones."""

import itertools
import threading

import numpy as np

from worker.decoding.batch_runner import DECODED, NO_KV_ROOM, StepOutput
from worker.decoding.commit import Commit
from worker.decoding.kv_streams import Copy, KvStreams
from worker.decoding.plan import Live, StepPlan, plan_step
from worker.decoding.results import DAMAGED_LOGITS
from worker.decoding.sampler import Sampling
from worker.decoding.sequences import Request, Sequence, Sequences, State
from worker.decoding.text import CompletionText

C = 4
EOG = 0
BOS = 1
VOCAB = 16
GREEDY = Sampling(0.0, 1.0, 40, 0.05, 1.0, 0.0, 0.0, 7)


class Sampler:
    """Draws the tokens it is given, in order, and records the rows it drew them from."""

    def __init__(self, tokens):
        self.tokens = list(tokens)
        self.rows: list[int] = []
        self.closed = False

    def close(self):
        self.closed = True


class Logits:
    """The batch's logits rows (all finite unless told), and each sequence's scripted draw."""

    def __init__(self, damaged=()):
        self.damaged = set(damaged)

    def row(self, place):
        row = np.zeros(VOCAB, dtype=np.float32)
        if place in self.damaged:
            row[3] = np.nan
        return row

    def sample(self, sampler, place):
        sampler.rows.append(place)
        return sampler.tokens.pop(0)


class Engine:
    """Sequences, KV streams and a commit, with the decoder's admission and plan, by hand."""

    def __init__(self, streams=4):
        self.seqs = Sequences()
        self.kv = KvStreams(streams, chunk_tokens=C)
        self.commit = Commit(self.seqs, self.kv, piece=lambda t: f"<{t}>".encode(), is_eog=lambda t: t == EOG, bos=BOS)
        self.ids = itertools.count()

    def admit(self, key, prompt_len=6, *, n=1, draws=(), max_tokens=8, stream=False):
        request = Request(
            key=key,
            prompt=list(range(2, 2 + prompt_len)),
            max_tokens=max_tokens,
            sampling=GREEDY,
            stops=[],
            cancel=threading.Event(),
            deadline=None,
            stream=stream,
            admitted=self.seqs.next_admission(),
        )
        for index in range(n):
            state = State.PREFILLING if index == 0 else State.WAITING
            tokens = draws[index] if draws else ()
            seq = Sequence(next(self.ids), request, index, Sampler(tokens), CompletionText.with_stops([]), state=state)
            self.seqs.add(seq)
        self.kv.place(request.sequences[0].id, request.prompt)
        self.seqs.requests[key] = request
        return request

    def plan(self) -> StepPlan:
        views = [
            Live(s.id, self.kv.stream_of(s.id), s.request.admitted, s.request.prompt, s.fed, s.pending, s.position)
            for s in self.seqs.live.values()
        ]
        return plan_step(views, chunk_tokens=C)

    def step(self, logits=None, code=DECODED):
        """Each batch of the plan 'decoded' (the logits given), then committed."""
        finished, ops = [], []
        for batch in self.plan().batches:
            ended, made = self.commit(StepOutput(batch, code, logits or Logits()))
            finished += ended
            ops += made
            if code == NO_KV_ROOM:
                break
        return {f.key: f for f in finished}, ops


def test_a_prompt_goes_in_then_each_step_draws_a_token_until_its_length():
    engine = Engine()
    request = engine.admit("a", draws=[(5, 6, 7)], max_tokens=3)
    seq = request.sequences[0]
    plan = engine.plan()
    assert [(c.start, c.end) for c in plan.chunks] == [(0, 4), (4, 6)]  # nothing else decodes: both at once
    engine.step()
    assert (seq.state, seq.fed, seq.completion) == (State.DECODING, 6, [5])
    assert seq.sampler.rows == [1]  # the last chunk's last row
    assert engine.kv.holds(0) == request.prompt[:4]  # a whole chunk is reusable, the partial one not
    done, _ = engine.step()
    assert not done and seq.completion == [5, 6]
    done, _ = engine.step()
    generation = done["a"].generation
    assert (generation.text, generation.finish_reason, generation.token_ids) == ("<5><6><7>", "length", (5, 6, 7))
    assert seq.state is State.FINISHED and seq.sampler.closed
    assert engine.seqs.live == {} and engine.seqs.requests == {} and engine.kv.free == 4


def test_end_of_text_ends_a_sequence_with_stop_and_its_token_is_not_kept():
    engine = Engine()
    engine.admit("a", prompt_len=2, draws=[(9, EOG)])
    engine.step()
    done, _ = engine.step()
    assert done["a"].generation.token_ids == (9,) and done["a"].generation.finish_reason == "stop"


def test_the_waiting_samples_are_forked_when_the_prompt_is_in_and_draw_from_its_last_row():
    engine = Engine()
    request = engine.admit("n3", prompt_len=3, n=3, draws=[(5, EOG), (6, EOG), (7, EOG)])
    waiting = request.sequences[1:]
    assert [s.state for s in waiting] == [State.WAITING, State.WAITING] and len(engine.seqs.waiting) == 2
    assert engine.kv.free == 3  # they hold no stream yet
    _, ops = engine.step()
    assert [s.state for s in request.sequences] == [State.DECODING] * 3 and engine.seqs.waiting == {}
    assert [engine.kv.stream_of(s.id) for s in request.sequences] == [0, 1, 2]
    assert ops == [Copy(0, 1), Copy(0, 2)]  # the prompt's stream, copied for each
    assert [s.fed for s in request.sequences] == [3, 3, 3]
    assert [s.sampler.rows for s in request.sequences] == [[2], [2], [2]]  # the chunk's last row, each its own chain
    done, _ = engine.step()
    assert [g.text for g in done["n3"].generations] == ["<5>", "<6>", "<7>"]
    assert [g.index for g in done["n3"].generations] == [0, 1, 2]


def test_a_request_cancelled_while_its_prompt_goes_in_ends_with_the_sample_it_has():
    engine = Engine()
    request = engine.admit("n3", prompt_len=9, n=3, draws=[(5,), (6,), (7,)])
    samplers = [s.sampler for s in request.sequences]
    request.cancel.set()
    done = {f.key: f for f in engine.commit.cut_off(now=0.0)}
    assert [(g.index, g.finish_reason, g.token_ids) for g in done["n3"].generations] == [(0, "cancelled", ())]
    assert engine.seqs.waiting == {} and engine.seqs.live == {} and engine.kv.free == 4
    assert all(s.closed for s in samplers) and not any(s.rows for s in samplers)


def test_no_kv_room_sends_the_newest_request_back_and_commits_nothing_else():
    engine = Engine()
    old = engine.admit("old", prompt_len=2, draws=[(5, 6, 7)])
    engine.step()
    new = engine.admit("new", prompt_len=2, draws=[(8,)])
    done, _ = engine.step(code=NO_KV_ROOM)
    assert done["new"].evicted and done["new"].generation is None
    assert old.sequences[0].completion == [5] and old.sequences[0].sampler.rows == [1]  # untouched
    assert new.sequences[0].state is State.FINISHED and engine.kv.free == 3
    engine.step()
    assert old.sequences[0].completion == [5, 6]


def test_damaged_logits_fail_their_request_alone():
    engine = Engine()
    engine.admit("a", prompt_len=2, draws=[(5, 6)])
    engine.admit("b", prompt_len=2, draws=[(7, 8, 9)])
    engine.step()  # their prompts: a first token each
    engine.step()  # both decode, in streams 0 and 1: rows 0 and 1 of the batch
    done, _ = engine.step(Logits(damaged={0}))
    assert done["a"].error == DAMAGED_LOGITS and done["a"].generation is None
    assert engine.seqs.requests["b"].sequences[0].completion == [7, 8, 9] and engine.kv.free == 3


def test_a_streaming_sequences_pieces_cover_its_tokens_and_join_to_its_text():
    engine = Engine()
    engine.admit("s", prompt_len=2, draws=[(5, 6, 7)], max_tokens=3, stream=True)
    done: dict = {}
    while "s" not in done:
        done.update(engine.step()[0])
    pieces = engine.commit.pieces
    assert "".join(p.text for p in pieces) == done["s"].generation.text == "<5><6><7>"
    assert sum(p.tokens for p in pieces) == 3
