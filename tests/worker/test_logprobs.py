"""Log-probabilities from the engine on the real bundled model, against a log-softmax computed
directly from llama.cpp's logits (``Llama`` with ``logits_all``: every row's logits of one
plain evaluation of the same tokens)."""

import llama_cpp
import numpy as np
import pytest

from tests.worker.generation import THREADS, direct_logprobs, engine_like_llama, generate, run_together
from worker.decoding import PREFILL_CHUNK_TOKENS
from worker.engine import LoadedModel

GREEDY = {"temperature": 0.0, "top_p": 1.0, "seed": 7}
HOT = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": 3}
TOLERANCE = 1e-4
# Longer than two prefill chunks, so the prompt's log-probabilities cross chunk boundaries.
LONG_PROMPT = "".join(f"Item {i}: the number {i * 7} is {'even' if i % 2 == 0 else 'odd'}.\n" for i in range(14))


def _model(model_path: str, slots: int, *, prompt_cache: bool = True) -> LoadedModel:
    return LoadedModel(
        model_path, n_ctx=1024, embedding=False, threads=THREADS, gpu_layers=0, slots=slots, prompt_cache=prompt_cache
    )


@pytest.fixture(scope="module")
def direct(model_path):
    llm = engine_like_llama(model_path)
    yield llm
    llm.close()


def _prompt(llm: llama_cpp.Llama, text: str) -> list[int]:
    return llm.tokenize(text.encode(), add_bos=True, special=True)


def test_each_tokens_logprob_and_its_top_alternatives_are_the_models_own(model_path, direct):
    model = _model(model_path, 1, prompt_cache=False)
    try:
        generation = generate(
            model, {"prompt": "The three primary colours are", "max_tokens": 12, "logprobs": 5} | GREEDY
        )
    finally:
        model.close()
    prompt = _prompt(direct, "The three primary colours are")
    expected = direct_logprobs(direct, prompt, generation.token_ids)
    assert generation.logprobs is not None and len(generation.logprobs) == generation.completion_tokens == 12
    for i, entry in enumerate(generation.logprobs):
        row = expected[len(prompt) - 1 + i]
        assert entry.token == generation.token_ids[i]
        assert entry.logprob == pytest.approx(row[entry.token], abs=TOLERANCE)
        best = np.argsort(-row)[:5]
        assert [t for t, _ in entry.top] == list(best)
        assert [lp for _, lp in entry.top] == pytest.approx(list(row[best]), abs=TOLERANCE)
        # Greedy: the chosen token is the most likely one.
        assert entry.top[0][0] == entry.token


def test_echo_gives_every_prompt_tokens_logprob_across_chunks_the_first_one_none(model_path, direct):
    prompt = _prompt(direct, LONG_PROMPT)
    assert len(prompt) > 2 * PREFILL_CHUNK_TOKENS
    model = _model(model_path, 2)
    try:
        request = {"prompt": LONG_PROMPT, "max_tokens": 4, "logprobs": 2, "echo": True} | GREEDY
        first = generate(model, request)
        again = generate(model, request)  # the cache now holds the prompt's chunks: echo decodes it whole anyway
    finally:
        model.close()
    assert first.prompt_logprobs is not None
    assert [e.token for e in first.prompt_logprobs] == prompt
    assert first.prompt_logprobs[0].logprob is None and first.prompt_logprobs[0].top == ()
    expected = direct_logprobs(direct, prompt)
    for i, entry in enumerate(first.prompt_logprobs[1:], start=1):
        assert entry.logprob == pytest.approx(expected[i - 1][prompt[i]], abs=TOLERANCE), i
        assert [t for t, _ in entry.top] == list(np.argsort(-expected[i - 1])[:2])
    assert again.cached_tokens == 0
    assert again == first
    assert [e.logprob for e in again.prompt_logprobs] == [e.logprob for e in first.prompt_logprobs]


def test_logprobs_beside_other_sequences_and_of_n_samples_are_each_samples_own(model_path, direct):
    prompt_text = "Once upon a time, in a small village,"
    model = _model(model_path, 4)
    try:
        done = run_together(
            model,
            {
                "n2": {"prompt": prompt_text, "max_tokens": 10, "logprobs": 0, "n": 2} | HOT,
                "other": {"prompt": "def fibonacci(n):", "max_tokens": 10} | GREEDY,
            },
        )
    finally:
        model.close()
    prompt = _prompt(direct, prompt_text)
    samples = done["n2"].generations
    assert len(samples) == 2 and samples[0].token_ids != samples[1].token_ids
    assert done["other"].generation.logprobs is None  # not asked: none computed
    for sample in samples:
        expected = direct_logprobs(direct, prompt, sample.token_ids)
        got = [e.logprob for e in sample.logprobs]
        want = [expected[len(prompt) - 1 + i][t] for i, t in enumerate(sample.token_ids)]
        assert got == pytest.approx(want, abs=TOLERANCE)
        assert all(e.top == () for e in sample.logprobs)  # logprobs 0: the chosen token's only


def test_a_stop_string_cuts_the_logprobs_with_the_text(model_path, direct):
    model = _model(model_path, 1)
    try:
        free = generate(model, {"prompt": "Count: 1, 2, 3,", "max_tokens": 12, "logprobs": 0} | GREEDY)
        stop = free.text.strip().split(" ")[2]  # a word the free answer reaches after a few tokens
        cut = generate(model, {"prompt": "Count: 1, 2, 3,", "max_tokens": 12, "logprobs": 0, "stop": [stop]} | GREEDY)
    finally:
        model.close()
    assert cut.finish_reason == "stop" and len(cut.text) < len(free.text)
    kept = len(cut.logprobs)
    assert 0 < kept < cut.completion_tokens
    # The tokens kept are those whose text starts before the cut: they cover the text, one less would not.
    text_of = lambda n: direct.detokenize(list(cut.token_ids[:n])).decode()  # noqa: E731
    assert text_of(kept).startswith(cut.text) and len(text_of(kept - 1)) < len(cut.text)
    assert [e.logprob for e in cut.logprobs] == [e.logprob for e in free.logprobs[:kept]]
