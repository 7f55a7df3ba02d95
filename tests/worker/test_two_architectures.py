"""The engine on a second real architecture, Gemma 3 270M beside SmolLM2 (Llama): what the
engine promises of one model it must keep on another. Reusing any common prefix was measured
exact on SmolLM2 only (a row's logits the same whatever the length of its pass); on Gemma 3 it
changed 5 of 22 texts, so ``auto`` reuses whole chunks there, which keep every text."""

import pytest

from tests.worker.generation import generate, run_together
from tests.worker.test_decoder import GREEDY, PROMPTS, SEEDED, _cache_requests, _model, _request
from worker.engine import LoadedModel


def _requests() -> dict[str, dict]:
    """The cache tests' few-shot prompts, and short prompts of which two run twice (greedy,
    then seeded: the second reuses the first's start)."""
    short = {
        f"p{i}:{kind}": _request(p, s) for i, p in enumerate(PROMPTS[:4]) for kind, s in (("g", GREEDY), ("s", SEEDED))
    }
    return _cache_requests() | short


def test_auto_reuse_is_any_prefix_for_smollm2_and_whole_chunks_for_gemma_on_the_cpu(model_path, second_model_path):
    for path, any_prefix in ((model_path, True), (second_model_path, False)):
        model = LoadedModel(path, n_ctx=512, embedding=False, threads=1, gpu_layers=0, slots=1)
        try:
            assert model.decoder is not None and model.decoder.kv.any_prefix is any_prefix, path
        finally:
            model.close()


@pytest.mark.parametrize("flash_attn", [True, False], ids=["flash-attn", "no-flash-attn"])
def test_gemmas_texts_are_the_same_from_the_cache_and_beside_others_as_alone(second_model_path, flash_attn):
    """Token for token, greedy and seeded: each request alone on a context with no cache, then
    all of them three at a time with the cache as ``auto`` sets it for Gemma on the CPU."""
    requests = _requests()
    alone_model = _model(second_model_path, 1, prompt_cache=False, any_prefix=False, flash_attn=flash_attn)
    try:
        alone = {key: generate(alone_model, request) for key, request in requests.items()}
    finally:
        alone_model.close()
    model = LoadedModel(
        second_model_path, n_ctx=1024, embedding=False, threads=1, gpu_layers=0, slots=3, flash_attn=flash_attn
    )
    try:
        assert model.decoder is not None
        done = run_together(model, requests)
        assert {key: f.generation.text for key, f in done.items()} == {key: g.text for key, g in alone.items()}
        assert sum(f.generation.cached_tokens for f in done.values()) >= 512  # the few-shot start was reused
    finally:
        model.close()
