"""Continuous batching on the real bundled model: sequences decoded together give the text
each gives alone, and one sequence's end (finished, cancelled, timed out) leaves the others
as they were."""

import threading
import time

import llama_cpp
import pytest

from worker.decoder import PREFILL_CHUNK_TOKENS
from worker.engine import LoadedModel

PROMPTS = [
    "The three primary colours are",
    "Count: 1, 2, 3,",
    "Question: name a fruit that is yellow. Answer:",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The capital of France is",
]
GREEDY = {"temperature": 0.0, "top_p": 1.0, "seed": 7}
SEEDED = {"temperature": 0.8, "top_p": 0.9, "seed": 11}
MAX_TOKENS = 32


def _request(prompt: str, sampling: dict, max_tokens: int = MAX_TOKENS) -> dict:
    return {"prompt": prompt, "max_tokens": max_tokens, "stop": []} | sampling


def _run_together(model: LoadedModel, requests: dict[str, dict], cancels: dict | None = None) -> dict:
    """Admits every request as soon as a slot is free (more requests than slots: slots are
    reused) and steps until all ended; returns each key's Finished."""
    pending = list(requests.items())
    done = {}
    while pending or model.decoder.active:
        while pending and model.decoder.free_slots:
            key, request = pending.pop(0)
            model.admit(key, request, (cancels or {}).get(key, threading.Event()))
        for finished in model.decoder.step():
            done[finished.key] = finished
    return done


@pytest.fixture(scope="module")
def alone(model_path):
    """Every request's generation with one slot: one sequence at a time."""
    model = LoadedModel(model_path, n_ctx=1024, embedding=False, threads=2, gpu_layers=0, slots=1)
    requests = {f"{kind}:{p}": _request(p, s) for p in PROMPTS for kind, s in (("greedy", GREEDY), ("seeded", SEEDED))}
    results = {key: model.generate(request, threading.Event()) for key, request in requests.items()}
    model.close()
    return requests, results


@pytest.fixture(scope="module")
def four_slots(model_path):
    model = LoadedModel(model_path, n_ctx=1024, embedding=False, threads=2, gpu_layers=0, slots=4)
    yield model
    model.close()


def test_sequences_decoded_together_give_the_text_each_gives_alone(alone, four_slots):
    requests, expected = alone
    together = _run_together(four_slots, requests)
    assert {key: f.generation for key, f in together.items()} == expected
    assert len({g.text for g in expected.values()}) > len(PROMPTS)  # seeded texts differ from greedy ones


def test_alone_the_decoder_gives_create_completions_own_text(alone, model_path):
    requests, expected = alone
    direct = llama_cpp.Llama(model_path=model_path, n_ctx=1024, n_threads=2, verbose=False)
    try:
        for key, request in list(requests.items())[:6]:
            direct.reset()  # no prompt cache from the previous call: each starts as gpuq's does
            out = direct.create_completion(
                request["prompt"],
                max_tokens=MAX_TOKENS,
                temperature=request["temperature"],
                top_p=request["top_p"],
                seed=request["seed"],
            )
            assert expected[key].text == out["choices"][0]["text"], key
            assert expected[key].completion_tokens == out["usage"]["completion_tokens"]
            assert expected[key].finish_reason == out["choices"][0]["finish_reason"]
    finally:
        direct.close()


def test_a_cancelled_sequence_leaves_and_the_others_run_to_their_end(alone, four_slots):
    requests, expected = alone
    chosen = {key: requests[key] for key in list(requests)[:4]}
    victim = next(iter(chosen))
    cancel = threading.Event()
    timer = threading.Timer(0.2, cancel.set)
    timer.start()
    long = dict(chosen[victim], max_tokens=600)  # still running when the cancel comes
    together = _run_together(four_slots, chosen | {victim: long}, {victim: cancel})
    timer.join()
    assert together[victim].generation.finish_reason == "cancelled"
    assert 0 < together[victim].generation.completion_tokens < 600
    for key in list(chosen)[1:]:
        assert together[key].generation == expected[key]


def test_a_sequence_past_its_deadline_fails_alone(alone, four_slots):
    requests, expected = alone
    keys = list(requests)[:3]
    counting = _request("Count from 1 to 1000: 1, 2, 3,", GREEDY, 600)
    four_slots.admit("late", counting, threading.Event(), time.monotonic() + 0.2)
    together = _run_together(four_slots, {key: requests[key] for key in keys})
    while four_slots.decoder.active:  # the late one may outlive the others by a step
        together.update({f.key: f for f in four_slots.decoder.step()})
    assert together["late"].generation is None and "timed out" in together["late"].error
    assert {key: together[key].generation for key in keys} == {key: expected[key] for key in keys}


def test_sequences_move_down_into_slots_freed_below_them_and_keep_their_text(alone, four_slots):
    """llama.cpp decodes only consecutive slots in one micro-batch: when a job ends with
    none waiting, the sequence in the highest slot moves into its slot, its KV copied."""
    requests, expected = alone
    keys = [f"greedy:{PROMPTS[3]}", f"seeded:{PROMPTS[4]}", f"greedy:{PROMPTS[5]}"]
    short = dict(requests[keys[0]], max_tokens=3)  # ends first, freeing slot 0
    four_slots.admit("short", short, threading.Event())
    for key in keys[1:]:
        four_slots.admit(key, requests[key], threading.Event())
    assert four_slots.decoder.live_slots() == [0, 1, 2]
    done = {}
    while "short" not in done:
        done.update({f.key: f for f in four_slots.decoder.step()})
    assert four_slots.decoder.live_slots() == [1, 2]  # a job could take slot 0 before the next step
    done.update({f.key: f for f in four_slots.decoder.step()})
    moved = four_slots.decoder.live_slots()
    while four_slots.decoder.active:
        done.update({f.key: f for f in four_slots.decoder.step()})
    assert moved == [0, 1]
    assert done["short"].generation.completion_tokens == 3
    assert {key: done[key].generation for key in keys[1:]} == {key: expected[key] for key in keys[1:]}


def test_a_long_prompt_is_fed_in_chunks_while_the_others_keep_generating(four_slots):
    cancels = {f"r{i}": threading.Event() for i in range(2)}
    for i, key in enumerate(cancels):
        four_slots.admit(key, _request(PROMPTS[i], GREEDY, 400), cancels[key])
    four_slots.decoder.step()  # their prompts
    four_slots.decoder.step()  # their first generated tokens
    long_prompt = "Summarise the following text. " + "The quick brown fox jumps over the lazy dog. " * 40
    cancels["long"] = threading.Event()
    prompt_tokens = four_slots.admit("long", _request(long_prompt, GREEDY, 4), cancels["long"])
    steps = []
    while True:
        four_slots.decoder.step()
        generated, prompt = four_slots.decoder.last_step
        if prompt == 0:
            break
        steps.append((generated, prompt))
    # The prompt went in over several steps, each a bounded chunk, and every one of those
    # steps still decoded the next token of both running sequences.
    assert sum(prompt for _generated, prompt in steps) == prompt_tokens > 3 * PREFILL_CHUNK_TOKENS
    assert all(prompt <= PREFILL_CHUNK_TOKENS for _generated, prompt in steps)
    assert all(generated == 2 for generated, _prompt in steps)
    for cancel in cancels.values():
        cancel.set()
    assert {f.generation.finish_reason for f in four_slots.decoder.step()} <= {"cancelled", "length"}
    assert four_slots.decoder.active == 0


def test_a_streaming_sequences_pieces_add_up_to_its_text_and_tokens_with_stop_strings_held_back(alone, four_slots):
    """Pieces come per step, in order; text that might become a stop string waits, so the
    pieces never show what the final text cuts off, and they cover every token once."""
    requests, results = alone
    key = f"greedy:{PROMPTS[1]}"
    plain = results[key].text
    # A stop string that occurs in the greedy text: the text ends just before it.
    stop = plain[len(plain) // 2 : len(plain) // 2 + 3]
    cases = {
        "plain": requests[key] | {"events": "tokens"},
        "stopped": requests[key] | {"events": "tokens", "stop": [stop]},
        "quiet": requests[key],  # not streaming: no pieces
    }
    pieces: dict[str, list] = {k: [] for k in cases}
    for k, request in cases.items():
        four_slots.admit(k, request, threading.Event())
    done = {}
    while four_slots.decoder.active:
        for finished in four_slots.decoder.step():
            done[finished.key] = finished
        for piece in four_slots.decoder.take_pieces():
            pieces[piece.key].append(piece)
            assert piece.key not in done or piece is not None  # text of a sequence comes before or with its end
    for k in ("plain", "stopped"):
        generation = done[k].generation
        assert "".join(p.text for p in pieces[k]) == generation.text
        assert sum(p.tokens for p in pieces[k]) == generation.completion_tokens
        assert generation.prompt_ms is not None and generation.eval_ms is not None
    assert done["plain"].generation.text == plain and len(pieces["plain"]) > 3
    assert done["stopped"].generation.text == plain[: plain.index(stop)]
    assert pieces["quiet"] == []


def test_with_the_prompt_cache_a_prompt_reuses_what_a_slot_holds_of_its_start(alone, model_path):
    """GPUQ_WORKER_PROMPT_CACHE: the slot whose last sequence shares the longest start with a
    new prompt serves it, and only the rest is decoded (the last token at least, for its
    logits); greedy text stays what it is without the cache."""
    requests, results = alone
    model = LoadedModel(model_path, n_ctx=1024, embedding=False, threads=2, gpu_layers=0, slots=2, prompt_cache=True)
    try:
        first, other = f"greedy:{PROMPTS[0]}", f"greedy:{PROMPTS[2]}"
        assert _run_together(model, {first: requests[first]})[first].generation == results[first]
        assert model.decoder.reused_tokens == 0  # nothing cached yet
        assert _run_together(model, {other: requests[other]})[other].generation == results[other]
        prompt_tokens = results[first].prompt_tokens
        again = _run_together(model, {"again": requests[first]})["again"].generation
        assert model.decoder.reused_tokens >= prompt_tokens - 1  # all but the last prompt token, from its slot
        assert again == results[first]
    finally:
        model.close()
