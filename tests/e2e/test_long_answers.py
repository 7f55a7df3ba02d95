"""Long answers give create_completion's own text (``Llama`` evaluating as the engine does),
byte for byte: the engine builds a
completion's text a token at a time (each token's bytes once, stop strings looked for only
where they can newly end) where create_completion detokenises and rescans it whole. In the
slow tier for its length: two answers of 2,000 tokens, each generated twice."""

import threading

import pytest

from tests.worker.generation import THREADS, engine_like_llama, generate
from worker.engine import LoadedModel

N_CTX = 2304
CASES = [
    # Greedy, counting on to max_tokens, with stop strings that almost occur ("10" in "100, 101").
    ("Count from 1 to 5000: 1, 2, 3,", {"temperature": 0.0, "top_p": 1.0, "seed": 3}, [", 1000,", "999 "]),
    # Seeded at temperature 1: varied text, multi-byte characters likely, a stop string held back.
    ("Écris une très longue histoire, avec des accents: «", {"temperature": 1.0, "top_p": 0.95, "seed": 5}, ["»»»"]),
]


# A test each, so that the two (minutes each on two cores) can run in two test processes.
@pytest.mark.parametrize(("prompt", "sampling", "stops"), CASES, ids=["greedy-count", "seeded-accents"])
def test_answers_of_2000_tokens_are_create_completions_own(model_path, prompt, sampling, stops):
    model = LoadedModel(model_path, n_ctx=N_CTX, embedding=False, threads=THREADS, gpu_layers=0, slots=1)
    try:
        mine = generate(model, {"prompt": prompt, "max_tokens": 2000, "stop": stops} | sampling, threading.Event())
    finally:
        model.close()
    direct = engine_like_llama(model_path, n_ctx=N_CTX, logits_all=False)
    try:
        out = direct.create_completion(prompt, max_tokens=2000, stop=stops, **sampling)
    finally:
        direct.close()
    choice = out["choices"][0]
    assert mine.text == choice["text"]
    assert (mine.completion_tokens, mine.finish_reason) == (out["usage"]["completion_tokens"], choice["finish_reason"])
    if sampling["temperature"] == 0.0:
        assert mine.completion_tokens == 2000  # the counting one ran its whole length
