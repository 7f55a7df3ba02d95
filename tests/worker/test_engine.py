"""llama.cpp through the worker's engine, on the real bundled model."""

import math
import threading

import pytest

from tests.worker.generation import THREADS, engine_like_llama, generate, run_together
from worker.engine import EMBED_CHUNK, JobCancelled, LoadedModel
from worker.model_cache import ModelCache, ModelSpec

GREEDY = {"temperature": 0.0, "top_p": 1.0, "seed": 7, "stop": []}


@pytest.fixture(scope="module")
def generator(model_path):
    model = LoadedModel(model_path, n_ctx=2048, embedding=False, threads=THREADS, gpu_layers=0)
    yield model
    model.close()


@pytest.fixture(scope="module")
def embedder(model_path):
    model = LoadedModel(model_path, n_ctx=2048, embedding=True, threads=THREADS, gpu_layers=0)
    yield model
    model.close()


def test_greedy_generation_is_what_llama_cpp_itself_produces(generator, model_path):
    request = {"prompt": "The three primary colours are", "max_tokens": 24} | GREEDY
    ours = generate(generator, request)
    direct = engine_like_llama(model_path, n_ctx=2048, logits_all=False)
    expected = direct.create_completion("The three primary colours are", max_tokens=24, temperature=0.0, seed=7)
    direct.close()
    assert ours.text == expected["choices"][0]["text"] and ours.text.strip()
    assert (ours.prompt_tokens, ours.completion_tokens) == (
        expected["usage"]["prompt_tokens"],
        expected["usage"]["completion_tokens"],
    )
    assert ours.finish_reason == "length"


def test_chat_messages_use_the_models_template(generator):
    request = {"messages": [{"role": "user", "content": "What is 2+2?"}], "max_tokens": 16} | GREEDY
    first = generate(generator, request)
    second = generate(generator, request)
    assert first == second  # deterministic at temperature 0
    assert first.prompt_tokens > 20  # SmolLM2's template adds its default system prompt


def test_a_stop_sequence_ends_the_text_before_it(generator):
    free = generate(generator, {"prompt": "Count: 1, 2, 3,", "max_tokens": 20} | GREEDY)
    assert " 5" in free.text and free.stop_sequence is None
    stopped = generate(generator, {"prompt": "Count: 1, 2, 3,", "max_tokens": 20} | GREEDY | {"stop": [" 5"]})
    assert stopped.finish_reason == "stop" and " 5" not in stopped.text
    assert stopped.stop_sequence == " 5"  # which one ended it: Anthropic's answer names it
    assert free.text.startswith(stopped.text)


def test_a_cancel_during_generation_stops_at_the_next_token(generator):
    cancel = threading.Event()
    request = {"prompt": "Once upon a time", "max_tokens": 200} | GREEDY
    done = run_together(
        generator, {"story": request}, {"story": cancel}, after_step=lambda step: step == 6 and cancel.set()
    )
    result = done["story"].generation
    assert result.finish_reason == "cancelled"
    # Set after the 6th step (the prompt and its first token, then five more): no 7th step.
    assert result.completion_tokens == 6


def test_embeddings_are_unit_vectors_that_tell_texts_apart(embedder):
    texts = ["The cat sat on the mat.", "The cat sat on the mat.", "Interest rates rose in March."]
    vectors, tokens = embedder.embed(texts, threading.Event())
    assert len(vectors) == 3 and all(len(v) == 576 for v in vectors)
    assert all(math.isclose(math.fsum(x * x for x in v), 1.0, rel_tol=1e-6) for v in vectors)
    assert vectors[0] == vectors[1]
    assert vectors[0] != vectors[2]
    assert tokens > 0


def test_many_texts_are_embedded_in_chunks_with_the_same_vectors(embedder):
    texts = [f"sentence number {i}" for i in range(EMBED_CHUNK + 3)]
    together, _ = embedder.embed(texts, threading.Event())
    alone, _ = embedder.embed([texts[-1]], threading.Event())
    assert len(together) == len(texts)
    assert all(math.isclose(a, b, abs_tol=1e-4) for a, b in zip(together[-1], alone[0], strict=True))


def test_a_cancelled_embedding_job_stops_between_chunks(embedder):
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(JobCancelled):
        embedder.embed(["x"] * (EMBED_CHUNK * 2), cancel)


def test_the_cache_keeps_models_loaded_and_evicts_the_least_recently_used(model_path):
    loads = []

    def loader(spec):
        loads.append(spec.name)
        return LoadedModel(spec.path, n_ctx=spec.n_ctx, embedding=spec.embedding, threads=1, gpu_layers=0)

    cache = ModelCache(loader, max_loaded=2)
    a, b, c = (ModelSpec(name, model_path, 512, False) for name in ("a", "b", "c"))
    assert cache.get(a)[1] > 0 and cache.get(a)[1] == 0  # second use: already loaded, no load time
    cache.get(b)
    cache.get(a)  # a is now the most recently used
    cache.get(c)  # evicts b
    assert cache.loaded_names() == ["a", "c"]
    cache.get(b)
    assert loads == ["a", "b", "c", "b"]
    cache.keep(b, 10, now=100.0)  # keep_alive: b may idle 10 s
    cache.keep(c, -1, now=100.0)  # c stays until evicted
    assert cache.unload_expired(now=105.0) == []
    assert cache.unload_expired(now=111.0) == ["b"] and cache.loaded_names() == ["c"]
    cache.clear()
    assert cache.loaded_names() == []


def test_a_keep_alive_that_may_not_shorten_only_ever_lengthens_a_models_stay(model_path):
    """A submitter's job (shortens=False) never brings an expiry forward: not with 0, not
    with a shorter time, not under a model kept forever; a longer one lengthens it."""

    def loader(spec):
        return LoadedModel(spec.path, n_ctx=spec.n_ctx, embedding=spec.embedding, threads=1, gpu_layers=0)

    cache = ModelCache(loader, max_loaded=2)
    a, b = (ModelSpec(name, model_path, 512, False) for name in ("a", "b"))
    cache.get(a), cache.get(b)
    cache.keep(a, 600, now=100.0)  # someone relies on a for 10 minutes
    cache.keep(a, 0, shortens=False, now=110.0)
    cache.keep(a, 60, shortens=False, now=120.0)
    cache.keep(b, -1, now=100.0)
    cache.keep(b, 0, shortens=False, now=110.0)
    assert cache.unload_expired(now=650.0) == [] and cache.loaded_names() == ["a", "b"]
    cache.keep(a, 1200, shortens=False, now=650.0)  # a longer stay is taken
    assert cache.unload_expired(now=1800.0) == []
    assert cache.unload_expired(now=1851.0) == ["a"]
    cache.keep(b, 0, now=1900.0)  # an admin's 0 unloads
    assert cache.unload_expired(now=1900.0) == ["b"]


def test_the_cache_evicts_to_stay_within_its_vram_budget(model_path):
    def loader(spec):
        return LoadedModel(spec.path, n_ctx=spec.n_ctx, embedding=spec.embedding, threads=1, gpu_layers=0)

    cache = ModelCache(loader, max_loaded=5, budget_mib=24 * 1024)
    small, big = ModelSpec("small", model_path, 512, False, 4096), ModelSpec("big", model_path, 512, False, 20480)
    cache.get(small)
    cache.get(ModelSpec("small", model_path, 512, True, 4096))  # its embedding context counts too
    assert cache.used_mib() == 8192
    cache.get(big)  # 8 + 20 GiB > 24 GiB: the least recently used go first, until it fits
    assert cache.loaded_names() == ["big", "small"] and cache.used_mib() == 24576
    cache.clear()
