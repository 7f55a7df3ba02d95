"""Preemption by priority on the real bundled model: low-priority sequences parked for an urgent
request (their cells to host memory) and resumed later give, token for token and logit for
logit, the texts they give never parked; a streamed one loses nothing; a parked one is never
overtaken by less urgent work, is parked at most ``MAX_PARKS`` times, and can be cancelled
while parked."""

import threading

import pytest

from tests.worker.generation import THREADS, admit, run_together
from worker.decoding import Finished
from worker.decoding.parking import MAX_PARKS
from worker.engine import LoadedModel

SLOTS = 2
N_CTX = 512
HIGH, NORMAL, LOW = 0, 1, 2
LOWS = {
    # log-probabilities too: the raw logits after a restore compared, not only the argmax
    "greedy": {"prompt": "Once upon a time, in a small village by the sea,", "temperature": 0.0, "seed": 3},
    "seeded": {"prompt": "The history of the lighthouse begins", "temperature": 0.9, "top_p": 0.95, "seed": 5},
}
URGENT = {"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0.0, "stop": []}
LOW_TOKENS = 40


def _low(name: str, **extra) -> dict:
    return LOWS[name] | {"max_tokens": LOW_TOKENS, "stop": [], "logprobs": 2} | extra


def _model(model_path, *, strict: bool = True) -> LoadedModel:
    return LoadedModel(
        model_path,
        n_ctx=N_CTX,
        embedding=False,
        threads=THREADS,
        gpu_layers=0,
        slots=SLOTS,
        prompt_cache=True,
        strict_priority=strict,
    )


@pytest.fixture(scope="module")
def never_parked(model_path):
    """The two low jobs decoded side by side, and the urgent one alone: nothing parked."""
    model = _model(model_path)
    done = run_together(model, {name: _low(name) for name in LOWS})
    done |= run_together(model, {"urgent": URGENT})
    model.close()
    return {key: finished.generation for key, finished in done.items()}


def _step_until_done(decoder, done: dict[str, Finished], pieces: list, beside_urgent: list | None = None) -> None:
    """Steps until every request ended; ``beside_urgent``: how many sequences each step decoded
    or prefilled while the urgent request was live."""
    while decoder.active:
        urgent_live = "urgent" in decoder.live_keys()
        for finished in decoder.step():
            done[finished.key] = finished
        pieces += decoder.take_pieces()
        if urgent_live and beside_urgent is not None:
            plan = decoder.last_plan
            beside_urgent.append(
                len({r.sequence for r in plan.rows} | {c.sequence for c in (*plan.chunks, *plan.beside)})
            )


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "park-only"])
def test_parked_sequences_resume_with_the_texts_they_give_never_parked(model_path, never_parked, strict):
    """Strict priority (the CPU's default): while the urgent request is live it decodes alone;
    park only (a GPU's): beside the low request that kept its stream."""
    model = _model(model_path, strict=strict)
    decoder = model.decoder
    admit(model, "greedy", _low("greedy"), priority=LOW)
    admit(model, "seeded", _low("seeded", events="tokens"), priority=LOW)
    done: dict[str, Finished] = {}
    pieces: list = []
    for _ in range(12):  # prompts in, and some tokens of each (the seeded one streamed out)
        assert not decoder.step()
        pieces += decoder.take_pieces()
    assert decoder.free_slots_for(HIGH) == 0 and decoder.parkable(HIGH) == SLOTS
    assert decoder.parkable(LOW) == 0  # only a more urgent request parks anyone
    assert decoder.park_for(HIGH, 1) == 1
    assert decoder.free_slots_for(HIGH) == 1 and decoder.free_slots == 0  # the parked one resumes first
    admit(model, "urgent", URGENT, priority=HIGH)
    stepping: list[int] = []
    _step_until_done(decoder, done, pieces, stepping)
    model.close()

    assert set(stepping) == ({1} if strict else {2})  # the urgent one alone, or beside the greedy one
    assert done["urgent"].generation == never_parked["urgent"]
    for name in LOWS:
        generation = done[name].generation
        assert generation is not None, done[name].error
        assert generation == never_parked[name], name  # text, token ids and log-probabilities
    parked = [done[name].generation for name in LOWS if done[name].generation.parks]
    # The newest of the least urgent went: the seeded one, admitted second.
    assert [g.text for g in parked] == [never_parked["seeded"].text]
    assert parked[0].parks == parked[0].resumes == 1 and parked[0].parked_ms > 0
    # What it streamed before it was parked and after it resumed is its whole text, once.
    assert "".join(p.text for p in pieces if p.key == "seeded") == never_parked["seeded"].text
    assert decoder.parks == decoder.resumes == 1


def test_a_parked_sequence_goes_before_less_urgent_work_and_is_parked_at_most_twice(model_path):
    model = _model(model_path, strict=False)  # the low and the normal request decode side by side
    decoder = model.decoder
    admit(model, "low", _low("greedy"), priority=LOW)
    admit(model, "normal", _low("seeded"), priority=NORMAL)
    for _ in range(8):
        decoder.step()
    for round_ in range(MAX_PARKS):
        assert decoder.park_for(HIGH, 1) == 1  # the low one each time: the least urgent
        # Its stream is free, and held for it: another low job waits; an urgent one may take it.
        assert decoder.free_slots_for(LOW) == 0 and decoder.free_slots_for(HIGH) == 1
        with pytest.raises(ValueError, match="free slots"):
            admit(model, f"late-{round_}", _low("greedy"), priority=LOW)
        admit(model, f"urgent-{round_}", URGENT, priority=HIGH)
        done: dict[str, Finished] = {}
        while f"urgent-{round_}" not in done:
            done |= {f.key: f for f in decoder.step()}
        decoder.step()  # the low one resumes into the stream the urgent one left
    # Parked twice: the low job keeps its slot from now on; the normal one is parked instead.
    assert decoder.parkable(HIGH) == 1
    assert decoder.park_for(HIGH, 2) == 1
    done = {}
    _step_until_done(decoder, done, [])
    model.close()
    assert done["low"].generation is not None and done["low"].generation.parks == MAX_PARKS
    assert done["normal"].generation is not None and done["normal"].generation.parks == 1


def test_a_job_cancelled_while_parked_ends_with_its_text_so_far_and_frees_everything(model_path, never_parked):
    model = _model(model_path)
    decoder = model.decoder
    cancel = threading.Event()
    admit(model, "greedy", _low("greedy"), priority=LOW)
    admit(model, "seeded", _low("seeded"), cancel, priority=LOW)
    for _ in range(12):
        decoder.step()
    assert decoder.park_for(HIGH, 1) == 1  # the seeded one
    admit(model, "urgent", URGENT, priority=HIGH)
    cancel.set()
    done: dict[str, Finished] = {}
    _step_until_done(decoder, done, [])
    seeded = done["seeded"].generation
    assert seeded is not None and seeded.finish_reason == "cancelled" and seeded.resumes == 0
    assert never_parked["seeded"].text.startswith(seeded.text) and seeded.completion_tokens > 0
    assert done["greedy"].generation == never_parked["greedy"]
    assert decoder.free_slots == SLOTS and decoder.active == 0
    model.close()
