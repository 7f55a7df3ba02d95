"""The engine on the real bundled model: requests decoded together give the text each gives
alone; prompts reused from the cache give the text they give without it; ``n`` samples are
forked from one evaluated prompt; one request's end leaves the others as they were."""

import threading
import time

import llama_cpp
import pytest

from gpuq.jobs.generation_params import GenerationParams
from tests.worker.generation import THREADS, admit, generate, run_together
from worker.decoding import PREFILL_CHUNK_TOKENS
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
MAX_TOKENS = 16
# A few-shot start longer than two prefill chunks (164 tokens), shared by the prompts of the cache tests.
FEW_SHOT = "".join(f"Q: what is {a} plus {b}? A: {a + b}.\n" for a, b in zip(range(3, 12), range(40, 49), strict=True))


def _request(prompt: str, sampling: dict, max_tokens: int = MAX_TOKENS) -> dict:
    return {"prompt": prompt, "max_tokens": max_tokens, "stop": []} | sampling


def _model(
    model_path: str,
    slots: int,
    *,
    prompt_cache: bool = True,
    n_ctx: int = 1024,
    any_prefix: bool | None = None,
    flash_attn: bool = False,
) -> LoadedModel:
    return LoadedModel(
        model_path,
        n_ctx=n_ctx,
        embedding=False,
        threads=THREADS,
        gpu_layers=0,
        slots=slots,
        prompt_cache=prompt_cache,
        any_prefix=any_prefix,
        flash_attn=flash_attn,
    )


@pytest.fixture(scope="module")
def alone(model_path):
    """Every request's generation with one slot and no cache: one sequence at a time."""
    model = _model(model_path, 1, prompt_cache=False)
    requests = {f"{kind}:{p}": _request(p, s) for p in PROMPTS for kind, s in (("greedy", GREEDY), ("seeded", SEEDED))}
    results = {key: generate(model, request) for key, request in requests.items()}
    model.close()
    return requests, results


@pytest.fixture(scope="module")
def four_slots(model_path):
    model = _model(model_path, 4)
    yield model
    model.close()


def test_sequences_decoded_together_give_the_text_each_gives_alone(alone, four_slots):
    requests, expected = alone
    together = run_together(four_slots, requests)
    assert {key: f.generation for key, f in together.items()} == expected
    assert len({g.text for g in expected.values()}) > len(PROMPTS)  # seeded texts differ from greedy ones


def test_alone_the_decoder_gives_create_completions_own_text(alone, model_path):
    requests, expected = alone
    direct = llama_cpp.Llama(model_path=model_path, n_ctx=1024, n_threads=THREADS, verbose=False)
    try:
        for key, request in list(requests.items())[:6]:
            direct.reset()  # no prompt cache from the previous call: each starts afresh
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
            assert len(expected[key].token_ids) == expected[key].completion_tokens
    finally:
        direct.close()


def test_a_cancelled_request_leaves_and_the_others_run_to_their_end(alone, four_slots):
    requests, expected = alone
    chosen = {key: requests[key] for key in list(requests)[:4]}
    victim = next(iter(chosen))
    cancel = threading.Event()
    long = dict(chosen[victim], max_tokens=600)
    together = run_together(
        four_slots, chosen | {victim: long}, {victim: cancel}, after_step=lambda step: step == 5 and cancel.set()
    )
    assert together[victim].generation.finish_reason == "cancelled"
    # Set after the 5th step (its prompt and first token, then four more): no 6th step for it.
    assert together[victim].generation.completion_tokens == 5
    for key in list(chosen)[1:]:
        assert together[key].generation == expected[key]


def test_a_request_past_its_deadline_fails_alone(alone, four_slots):
    requests, expected = alone
    keys = list(requests)[:3]
    admit(four_slots, "late", _request("Count from 1 to 1000: 1, 2, 3,", GREEDY, 600), deadline=time.monotonic())
    together = run_together(four_slots, {key: requests[key] for key in keys})
    assert together["late"].generation is None and "timed out" in together["late"].error
    assert {key: together[key].generation for key in keys} == {key: expected[key] for key in keys}


def test_sequences_move_down_into_streams_freed_below_them_and_keep_their_text(alone, four_slots):
    """llama.cpp decodes only consecutive streams in one micro-batch: when a request ends with
    none waiting, the sequence in the highest stream moves into its stream, its KV copied."""
    requests, expected = alone
    keys = list(requests)[:3]
    admit(four_slots, "short", _request(PROMPTS[0], GREEDY, 3))
    for key in keys[1:]:
        admit(four_slots, key, requests[key])
    decoder = four_slots.decoder
    assert decoder.live_slots() == [0, 1, 2]
    done = {}
    while "short" not in done:
        done.update({f.key: f for f in decoder.step()})
    assert decoder.live_slots() == [1, 2]
    done.update({f.key: f for f in decoder.step()})
    moved = decoder.live_slots()
    while decoder.active:
        done.update({f.key: f for f in decoder.step()})
    assert moved == [0, 1]
    assert done["short"].generation.completion_tokens == 3
    assert {key: done[key].generation for key in keys[1:]} == {key: expected[key] for key in keys[1:]}


def test_a_long_prompt_goes_in_chunk_by_chunk_while_the_others_keep_generating(four_slots):
    decoder = four_slots.decoder
    cancels = {f"r{i}": threading.Event() for i in range(2)}
    for i, key in enumerate(cancels):
        admit(four_slots, key, _request(PROMPTS[i], GREEDY, 400), cancels[key])
    decoder.step()  # their prompts
    # About 250 tokens: four prefill chunks.
    long_prompt = "Summarise the following text. " + "The quick brown fox jumps over the lazy dog. " * 24
    cancels["long"] = threading.Event()
    admit(four_slots, "long", _request(long_prompt, GREEDY, 4), cancels["long"])
    prompt_tokens = len(four_slots.prompt_tokens(GenerationParams.model_validate(_request(long_prompt, GREEDY))))
    steps = []
    while True:
        decoder.step()
        plan = decoder.last_plan
        generated, prompt = len(plan.rows), plan.prompt_tokens
        if prompt == 0:
            break
        steps.append((generated, prompt))
    # The prompt went in over several steps, a chunk each, and every one of those steps
    # still decoded the next token of both running sequences.
    assert sum(prompt for _generated, prompt in steps) == prompt_tokens > 3 * PREFILL_CHUNK_TOKENS
    assert all(prompt <= PREFILL_CHUNK_TOKENS for _generated, prompt in steps)
    assert all(generated == 2 for generated, _prompt in steps)
    for cancel in cancels.values():
        cancel.set()
    assert {f.generation.finish_reason for f in decoder.step()} <= {"cancelled", "length"}
    assert decoder.active == 0


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
        admit(four_slots, k, request)
    decoder = four_slots.decoder
    done = {}
    while decoder.active:
        ended = {f.key: f for f in decoder.step()}
        for piece in decoder.take_pieces():
            assert piece.key not in done, "a piece came after its request's end"
            pieces[piece.key].append(piece)
        done.update(ended)
    for k in ("plain", "stopped"):
        generation = done[k].generation
        assert "".join(p.text for p in pieces[k]) == generation.text
        assert sum(p.tokens for p in pieces[k]) == generation.completion_tokens
        assert generation.prompt_ms is not None and generation.eval_ms is not None
    assert done["plain"].generation.text == plain and len(pieces["plain"]) > 3
    assert done["stopped"].generation.text == plain[: plain.index(stop)]
    assert pieces["quiet"] == []


def test_token_bytes_the_desk_asks_while_the_engine_decodes_are_always_the_tokens_own(alone, four_slots):
    """The desk asks tokens' bytes (a streamed piece's or a result's log-probabilities) while the
    engine samples and appends text on its own thread, and llama.cpp's ctypes calls release the
    GIL: a buffer the two threads shared handed one thread the bytes of the other's token."""
    requests, expected = alone
    decoder = four_slots.decoder
    tokens = sorted({t for g in expected.values() for t in g.token_ids})
    own = {t: decoder.token_bytes(t) for t in tokens}
    assert len(set(own.values())) == len(tokens)  # a token read for another shows
    done = threading.Event()
    wrong: list[tuple[int, bytes]] = []
    asked = 0

    def desk() -> None:
        nonlocal asked
        while not done.is_set():
            for token in tokens:
                got = decoder.token_bytes(token)
                if got != own[token]:
                    wrong.append((token, got))
            asked += len(tokens)

    thread = threading.Thread(target=desk, name="desk")
    thread.start()
    try:
        rounds = [run_together(four_slots, requests) for _ in range(3)]
    finally:
        done.set()
        thread.join()
    assert asked > 10 * len(tokens)
    assert wrong == []
    for together in rounds:
        assert {key: f.generation for key, f in together.items()} == expected


# ---------------------------------------------------------------- prompts reused from the cache

QUESTIONS = [f"Q: what is {a} plus {b}? A:" for a, b in ((7, 8), (30, 12), (5, 99))]


def _cache_requests() -> dict[str, dict]:
    """Prompts that share the few-shot start (some share more: two ask the same question), half
    greedy and half seeded at temperature 1, where a logit's last bit can change the text."""
    prompts = [FEW_SHOT + q for q in QUESTIONS] + [FEW_SHOT + QUESTIONS[0], FEW_SHOT[:200] + "Tell me a story:"]
    hot = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0}
    return {
        f"{i}:{kind}": _request(p, s | {"seed": 100 + i}, 12)
        for i, p in enumerate(prompts)
        for kind, s in (("greedy", GREEDY), ("seeded", hot))
    }


@pytest.fixture(scope="module")
def uncached(model_path):
    """Each cache request's generation with no cache at all (the chunks of a fresh prompt end
    a little differently when any prefix is reused: no lone last token), by that mode."""
    results = {}
    for any_prefix in (True, False):
        model = _model(model_path, 1, prompt_cache=False, any_prefix=any_prefix)
        results[any_prefix] = {key: generate(model, request) for key, request in _cache_requests().items()}
        model.close()
    return results


@pytest.mark.parametrize("any_prefix", [True, False], ids=["any-prefix", "whole-chunks"])
def test_a_prompt_that_hits_the_cache_gives_the_text_it_gives_without_it(uncached, model_path, any_prefix):
    """Token for token, greedy and seeded: the start a prompt takes from a KV stream (a live
    one copied, or one kept after its sequence ended) was computed exactly as the prompt
    would compute it: any common prefix (the CPU's default), or whole chunks only (a GPU's)."""
    requests = _cache_requests()
    for slots in (1, 3):  # one stream: reuse from the kept stream only; three: live ones copied too
        model = _model(model_path, slots, any_prefix=any_prefix)
        try:
            done = run_together(model, requests)
            assert {key: f.generation for key, f in done.items()} == uncached[any_prefix], f"{slots} slots"
            cached = {key: f.generation.cached_tokens for key, f in done.items()}
            assert cached[next(iter(cached))] == 0  # the first prompt found nothing
            hits = [n for n in cached.values() if n]
            assert len(hits) >= len(requests) - slots - 2
            if any_prefix:  # the shared start is taken whole, past its last chunk boundary
                assert any(n % PREFILL_CHUNK_TOKENS for n in hits)
            else:
                assert all(n % PREFILL_CHUNK_TOKENS == 0 for n in hits)
            assert model.decoder.reused_tokens == sum(cached.values())
        finally:
            model.close()


def test_with_flash_attention_a_prompt_gives_the_same_text_alone_beside_others_and_from_the_cache(model_path):
    """Flash attention on (GPUQ_WORKER_FLASH_ATTN), any common prefix reused: each request run
    alone with no cache, then all of them three at a time with the cache, token for token.
    The few-shot start puts the streams past 512 cells, where ggml's CPU flash attention
    decodes a lone row with other kernels (and rows of 64-row passes with others again)."""
    requests = _cache_requests()
    model = _model(model_path, 2, prompt_cache=False, any_prefix=True, flash_attn=True)
    try:
        alone = {key: generate(model, request) for key, request in requests.items()}
    finally:
        model.close()
    model = _model(model_path, 3, any_prefix=True, flash_attn=True)
    try:
        done = run_together(model, requests)
        assert {key: f.generation for key, f in done.items()} == alone
        assert sum(f.generation.cached_tokens > 0 for f in done.values()) >= len(requests) - 5
    finally:
        model.close()


def test_with_flash_attention_short_prompts_go_in_beside_the_decode_rows_and_keep_their_text(model_path):
    """With flash attention, a prompt with at most SHORT_TAIL_TOKENS tokens left, taken while
    others decode, goes in a token a step inside their pass (plan.py), where alone it went in
    by a pass of its own: the same texts, greedy and seeded, token for token, and the same
    log-probabilities to the last bit (a logit moved by less than a text shows would change them)."""
    short = ["The three primary colours are red,", "def add(a, b):", "The capital of France is called"]
    short += ["Water boils at a temperature of", "The best way to learn is"]  # 6 or 7 tokens each
    pairs = [(p, kind, s) for p in short for kind, s in (("greedy", GREEDY), ("seeded", SEEDED))]
    # Lengths apart, so that sequences end at different steps and the next come in beside others.
    requests = {f"{kind}:{p}": _request(p, s, 6 + 3 * i) | {"logprobs": 2} for i, (p, kind, s) in enumerate(pairs)}
    model = _model(model_path, 2, prompt_cache=False, any_prefix=True, flash_attn=True)
    try:
        alone = {key: generate(model, request) for key, request in requests.items()}
    finally:
        model.close()
    model = _model(model_path, 3, prompt_cache=False, any_prefix=True, flash_attn=True)
    beside: set[tuple[int, int]] = set()

    def note_beside(_step: int) -> None:
        plan = model.decoder.last_plan
        beside.update((c.sequence, c.start) for c in plan.beside)

    try:
        done = run_together(model, requests, after_step=note_beside)
    finally:
        model.close()
    assert {key: f.generation for key, f in done.items()} == alone
    assert len({sequence for sequence, _start in beside}) >= 4  # prompts that went in beside others


def test_prompts_taken_while_others_decode_go_in_beside_them_in_the_order_they_came(model_path):
    """One-token answers arriving all the while (a classification batch): each new prompt takes
    the lowest free stream, yet the prompts go in beside the decode rows oldest first, none
    held back by those that came after it; and each goes in from the stream next to the decode
    rows, also when no new prompt comes to fill the streams freed below the last ones."""
    model = _model(model_path, 6, prompt_cache=False, any_prefix=True, flash_attn=True)
    decoder = model.decoder
    try:
        cancels = {f"long{i}": threading.Event() for i in range(2)}
        for key, cancel in cancels.items():
            admit(model, key, _request(PROMPTS[0], GREEDY, 400), cancel)
        decoder.step()
        admitted = 0
        order: list[int] = []
        while len(order) < 12:
            while decoder.free_slots and admitted < 12:
                admit(model, f"short{admitted}", _request("Hi", GREEDY, 1))
                admitted += 1
            order += [int(f.key.removeprefix("short")) for f in decoder.step()]
            plan = decoder.last_plan
            assert len(plan.rows) == 2 and len(plan.beside) == 1 and plan.beside[0].stream == 2
        assert order == list(range(12))
        for cancel in cancels.values():
            cancel.set()
        decoder.step()
    finally:
        model.close()


def test_with_the_cache_off_nothing_is_reused(model_path, uncached):
    model = _model(model_path, 2, prompt_cache=False)
    try:
        some = dict(list(_cache_requests().items())[:4])
        done = run_together(model, some)
        assert {k: f.generation for k, f in done.items()} == {k: uncached[True][k] for k in some}
        assert model.decoder.reused_tokens == 0
    finally:
        model.close()


# ---------------------------------------------------------------- n samples of one prompt


def test_n_samples_are_forked_from_one_evaluated_prompt_each_seeded_seed_plus_its_index(model_path):
    prompt = FEW_SHOT + QUESTIONS[1]
    hot = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": 40}
    reference = _model(model_path, 1, prompt_cache=False)
    try:
        singles = [generate(reference, _request(prompt, hot | {"seed": 40 + i}, 10)) for i in range(3)]
    finally:
        reference.close()
    model = _model(model_path, 3, prompt_cache=False)
    try:
        before = model.decoder.tokens_decoded
        done = run_together(model, {"n3": _request(prompt, hot, 10) | {"n": 3}})["n3"]
        generations = done.generations
        assert [g.index for g in generations] == [0, 1, 2]
        assert [(g.text, g.token_ids) for g in generations] == [(s.text, s.token_ids) for s in singles]
        assert len({g.text for g in generations}) > 1  # three samples, not one three times
        # The prompt was decoded once; then each sample's tokens were fed back, all but one
        # that ended on max_tokens (its last token is never decoded; an end-of-text is not kept).
        decoded = model.decoder.tokens_decoded - before
        fed_back = sum(g.completion_tokens - (g.finish_reason == "length") for g in generations)
        assert decoded == generations[0].prompt_tokens + fed_back
    finally:
        model.close()


def test_a_request_of_n_samples_waits_for_n_free_slots(model_path):
    model = _model(model_path, 2)
    try:
        with pytest.raises(ValueError, match="needs 3 free slots"):
            admit(model, "too-many", _request(PROMPTS[0], GREEDY) | {"n": 3})
        assert model.decoder.active == 0 and model.decoder.free_slots == 2
    finally:
        model.close()
