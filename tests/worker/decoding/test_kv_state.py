"""A KV stream saved to bytes and restored, on the real bundled model: a start computed by the
engine, evicted from its stream, restored from the prefix cache's RAM tier into another stream,
or from its disk tier into a fresh context, gives the text and log-probabilities (every raw
logit the sampler saw, to the bit) that the stream that computed it gives."""

import llama_cpp
import numpy as np
import pytest

from gpuq.jobs.generation_params import GenerationParams
from gpuq.prefix_blocks import cache_scope, model_fingerprint, namespace_salt
from tests.worker.generation import THREADS, generate
from worker.decoding import FLASH_ATTN_CHUNK_TOKENS, PREFILL_CHUNK_TOKENS
from worker.decoding.kv_state import restore_stream, save_stream, stream_length
from worker.engine import LoadedModel
from worker.prefix_cache import CacheKey, KvLayout, PrefixCache

SLOTS = 4
N_CTX = 1024
# A few-shot start of about 450 tokens, and questions after it.
FEW_SHOT = "".join(f"Q: what is {a} times {b}? A: {a * b}.\n" for a in range(2, 6) for b in range(3, 10))
QUESTIONS = ["Q: what is 7 times 8? A:", "Q: what is 9 times 6? A:"]
GREEDY = {"temperature": 0.0, "seed": 7, "logprobs": 3}  # log-probabilities: the raw logits compared too
SEEDED = {"temperature": 0.9, "top_p": 0.95, "seed": 11, "logprobs": 3}
MAX_TOKENS = 12
SAMPLING = {"greedy": GREEDY, "seeded": SEEDED}


def _model(model_path, slots=SLOTS, *, prompt_cache=True, any_prefix=True):
    # The CPU defaults: flash attention on, any common prefix reused (passes of at most 63 rows).
    return LoadedModel(
        model_path,
        n_ctx=N_CTX,
        embedding=False,
        threads=THREADS,
        gpu_layers=0,
        slots=slots,
        prompt_cache=prompt_cache,
        any_prefix=any_prefix,
    )


def _request(tokens, sampling):
    return {"prompt_token_ids": tokens, "max_tokens": MAX_TOKENS, "stop": []} | sampling


def _ctx(model):
    return model.decoder._runner._ctx.ctx  # the decoder's llama_context_p


def _scope(model):
    """The cache scope ``LoadedModel.prepare`` gives a job without an owner (as ``generate`` sends)."""
    return namespace_salt(model.fingerprint, cache_scope(None, shared=False))


def _key(model_path, *, any_prefix=True):
    layout = KvLayout(
        type_k=1, type_v=1, kv_unified=False, n_seq_max=SLOTS, n_ctx_seq=N_CTX, flash_attn=True,
        reuse="any-prefix" if any_prefix else "whole-chunks",
        chunk_tokens=FLASH_ATTN_CHUNK_TOKENS if any_prefix else PREFILL_CHUNK_TOKENS,
        gpu_layers=0, llama_version="0.3.36",
    )  # fmt: skip
    return CacheKey.of(namespace_salt(model_fingerprint(model_path), cache_scope("acme", shared=False)), layout)


@pytest.fixture(scope="module")
def computed(model_path):
    """Each request's generation computed cold (no reuse: every prompt decoded whole), and the
    start a stream of the engine kept after computing the second prompt, saved."""
    cold_model = _model(model_path, prompt_cache=False)
    start = cold_model.prompt_tokens(GenerationParams(prompt=FEW_SHOT))
    assert 420 <= len(start) <= 500
    prompts = [cold_model.prompt_tokens(GenerationParams(prompt=FEW_SHOT + q)) for q in QUESTIONS]
    cold = {(i, name): generate(cold_model, _request(p, s)) for i, p in enumerate(prompts) for name, s in
            SAMPLING.items()}  # fmt: skip
    cold_model.close()
    model = _model(model_path)
    assert generate(model, _request(prompts[1], GREEDY)) == cold[(1, "greedy")]
    held = model.decoder.kv.holds(0)  # the reusable tokens its stream kept (it ran alone: stream 0)
    assert held == prompts[1][: len(held)] and len(held) >= len(prompts[1]) - 2
    data = save_stream(_ctx(model), 0, keep=len(held))
    assert stream_length(_ctx(model), 0) == len(held)  # the unreusable tail (the completion's cells) went
    model.close()
    return prompts, cold, held, data


def test_a_start_restored_from_ram_into_another_stream_gives_the_text_it_was_computed_with(model_path, computed):
    prompts, cold, held, data = computed
    cache = PrefixCache(ram_limit_bytes=1 << 30)
    cache.save(_key(model_path), held, data)
    restored = 0
    for (i, name), expected in cold.items():
        prompt = prompts[i]
        model = _model(model_path)  # a context that never computed this start
        found = cache.lookup(_key(model_path), prompt, limit=len(prompt) - 2)
        assert found is not None and found.tier == "ram"
        shared = next((n for n, (a, b) in enumerate(zip(prompt, held, strict=False)) if a != b), len(held))
        assert found.tokens == min(shared, len(prompt) - 2)  # prompt 0 shares the start and "Q: what is " only
        with cache.restoring(found):
            assert restore_stream(_ctx(model), 2, found.entry.data, keep=found.tokens)
        cache.restored(found, ok=True)
        restored += found.tokens
        model.decoder.kv.restored(2, prompt[: found.tokens], _scope(model))  # what the wiring tells KvStreams
        got = generate(model, _request(prompt, SAMPLING[name]))  # takes stream 0, copied from stream 2
        assert got == expected, (i, name)
        assert got.cached_tokens == found.tokens
        model.close()
    stats = cache.stats()
    assert (stats.hits_ram, stats.tokens_restored_ram) == (len(cold), restored)


def test_a_start_restored_from_disk_into_a_fresh_context_gives_the_same_text(model_path, computed, tmp_path):
    prompts, cold, held, data = computed
    writer = PrefixCache.open(ram_limit_bytes=1 << 30, disk_dir=tmp_path, disk_limit_bytes=1 << 30)
    writer.save(_key(model_path), held, data)
    writer.close()  # the worker stopped; a new one starts with an empty RAM tier
    reader = PrefixCache.open(ram_limit_bytes=1 << 30, disk_dir=tmp_path, disk_limit_bytes=1 << 30)
    model = _model(model_path)
    prompt = prompts[1]
    found = reader.lookup(_key(model_path), prompt, limit=len(prompt) - 2)
    assert found is not None and found.tier == "disk" and found.tokens == min(len(held), len(prompt) - 2)
    assert restore_stream(_ctx(model), 0, found.entry.data, keep=len(held))
    assert save_stream(_ctx(model), 0, keep=len(held)) == data  # the cells came back bit for bit ...
    assert restore_stream(_ctx(model), 0, found.entry.data, keep=found.tokens)  # ... then cut where the prompt needs
    model.decoder.kv.restored(0, prompt[: found.tokens], _scope(model))
    for name in ("greedy", "seeded"):
        got = generate(model, _request(prompt, SAMPLING[name]))
        assert got == cold[(1, name)] and got.cached_tokens == found.tokens
    model.close()


def test_with_whole_chunk_reuse_a_restored_start_gives_the_text_it_was_computed_with(model_path):
    """A GPU's default: only whole 64-token chunks are reusable, each computed in a pass of its own."""
    cold_model = _model(model_path, prompt_cache=False, any_prefix=False)
    prompt = cold_model.prompt_tokens(GenerationParams(prompt=FEW_SHOT + QUESTIONS[0]))
    cold = generate(cold_model, _request(prompt, GREEDY))
    cold_model.close()
    model = _model(model_path, any_prefix=False)
    assert generate(model, _request(prompt, GREEDY)) == cold
    held = model.decoder.kv.holds(0)
    assert len(held) == len(prompt) // PREFILL_CHUNK_TOKENS * PREFILL_CHUNK_TOKENS  # the last partial chunk is not
    data = save_stream(_ctx(model), 0, keep=len(held))
    model.close()
    cache = PrefixCache(ram_limit_bytes=1 << 30)
    cache.save(_key(model_path, any_prefix=False), held, data)
    fresh = _model(model_path, any_prefix=False)
    found = cache.lookup(_key(model_path, any_prefix=False), prompt, limit=len(prompt) - 1, unit=PREFILL_CHUNK_TOKENS)
    assert found is not None and found.tokens == len(held)
    assert restore_stream(_ctx(fresh), 1, found.entry.data, keep=found.tokens)
    fresh.decoder.kv.restored(1, prompt[: found.tokens], _scope(fresh))
    got = generate(fresh, _request(prompt, GREEDY))
    assert got == cold and got.cached_tokens == len(held)
    assert cache.lookup(_key(model_path), prompt, limit=len(prompt) - 2) is None  # not under any-prefix's key
    fresh.close()


def test_a_context_of_another_shape_refuses_the_bytes_and_its_stream_stays_empty(model_path, computed):
    _prompts, _cold, _held, data = computed
    model = _model(model_path, slots=2)  # llama.cpp's sequence state counts the context's streams
    assert not restore_stream(_ctx(model), 1, data, keep=100)
    assert stream_length(_ctx(model), 1) == 0
    model.close()


def test_copies_not_yet_applied_are_what_saves_and_restores_must_wait_for(model_path):
    """llama.cpp copies a stream's rows at the next decode: a restore into a pending copy's source
    changes what the copy carries, a save of a pending copy's destination reads the old rows;
    after a decode both are safe (the rule kv_state.py states for the wiring)."""
    model = _model(model_path)
    ctx, memory = _ctx(model), llama_cpp.llama_get_memory(_ctx(model))
    batch = llama_cpp.llama_batch_init(64, 0, 1)
    n_vocab = model.decoder._n_vocab

    def decode(rows):
        batch.n_tokens = len(rows)
        for i, (token, pos, stream, logits) in enumerate(rows):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, pos, 1, logits
            batch.seq_id[i][0] = stream
        assert llama_cpp.llama_decode(ctx, batch) == 0

    def prefill(stream, first):
        for start in (0, 50):
            decode([(first + p, p, stream, False) for p in range(start, start + 50)])

    def differ(s1, s2):
        """The largest logit difference of the same next token in two streams (0: the same cells)."""
        decode([(7, 100, s1, True), (7, 100, s2, True)])
        rows = [np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).copy() for i in (0, 1)]
        for s in (s1, s2):
            llama_cpp.llama_memory_seq_rm(memory, s, 100, -1)
        return float(np.abs(rows[0] - rows[1]).max())

    try:
        prefill(0, 100)
        llama_cpp.llama_memory_seq_cp(memory, 0, 1, -1, -1)
        early = save_stream(ctx, 1, keep=100)  # its copy not applied yet
        assert restore_stream(ctx, 3, early, keep=100)
        assert differ(0, 3) > 1  # the saved rows were not stream 0's
        llama_cpp.llama_memory_seq_rm(memory, 3, -1, -1)
        prefill(2, 3000)
        other, first = save_stream(ctx, 2, keep=100), save_stream(ctx, 0, keep=100)
        llama_cpp.llama_memory_seq_cp(memory, 0, 3, -1, -1)
        assert restore_stream(ctx, 0, other, keep=100)  # into the source of a copy not applied yet
        assert differ(3, 2) == 0  # the copy carried the restored rows, not stream 0's
        llama_cpp.llama_memory_seq_cp(memory, 2, 1, -1, -1)
        assert restore_stream(ctx, 3, first, keep=100)
        assert differ(1, 2) == 0  # a decode applied the copy ...
        assert restore_stream(ctx, 2, first, keep=100)  # ... so a restore into its source is safe now
        assert differ(1, 0) == 0 and differ(2, 3) == 0
    finally:
        llama_cpp.llama_batch_free(batch)
        model.close()
