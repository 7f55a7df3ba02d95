"""The prefix cache wired into the decoder, on the real bundled model: more prompt families
than slots, interleaved as a batch file often is, get their starts back from host RAM (and, in
a fresh context, from disk), and every job's text and log-probabilities are those of a run
that computed every prompt whole. One tenant never gets another's start."""

import pytest

from gpuq.jobs.generation_params import GenerationParams
from tests.worker.generation import THREADS, admit, run_together
from worker.engine import LoadedModel
from worker.prefix_cache import PrefixCache

SLOTS = 2
N_CTX = 512
FAMILIES = 4  # twice the slots: a family's start has left the streams when it comes back
MAX_TOKENS = 6
GREEDY = {"temperature": 0.0, "seed": 7, "logprobs": 2}  # log-probabilities: the raw logits compared too
SEEDED = {"temperature": 0.9, "top_p": 0.95, "seed": 11, "logprobs": 2}
MIB = 1 << 20


def _start(family: int) -> str:
    """A distinct few-shot start of about 120 tokens."""
    return "".join(f"Q: what is {a} times {family + 3}? A: {a * (family + 3)}.\n" for a in range(2, 11))


def _requests() -> dict[str, dict]:
    """Two rounds over the families, interleaved; greedy and seeded alternate."""
    requests = {}
    for round_ in range(2):
        for family in range(FAMILIES):
            sampling = GREEDY if (family + round_) % 2 == 0 else SEEDED
            prompt = _start(family) + f"Q: what is {round_ + 12} times {family + 3}? A:"
            requests[f"r{round_}f{family}"] = {"prompt": prompt, "max_tokens": MAX_TOKENS, "stop": []} | sampling
    return requests


def _model(model_path, *, prompt_cache=True, cache=None, shared_tenants=False):
    return LoadedModel(
        model_path,
        n_ctx=N_CTX,
        embedding=False,
        threads=THREADS,
        gpu_layers=0,
        slots=SLOTS,
        prompt_cache=prompt_cache,
        prefix_cache=cache,
        shared_tenants=shared_tenants,
    )


@pytest.fixture(scope="module")
def cold(model_path):
    """Every job computed whole: no reuse of any kind."""
    model = _model(model_path, prompt_cache=False)
    done = run_together(model, _requests())
    model.close()
    return {key: finished.generation for key, finished in done.items()}


def test_starts_restored_from_ram_give_the_texts_computed_whole(model_path, cold):
    cache = PrefixCache(ram_limit_bytes=256 * MIB)
    model = _model(model_path, cache=cache)
    done = run_together(model, _requests())
    model.close()
    for key, finished in done.items():
        assert finished.generation == cold[key], key  # text, token ids and log-probabilities
    second = [done[f"r1f{family}"].generation for family in range(FAMILIES)]
    # Each family's start left the two streams before its second job came, and came back from RAM.
    assert all(g is not None and g.cached_ram_tokens >= 100 for g in second), second
    assert all(g is not None and g.cached_tokens == g.cached_ram_tokens for g in second)
    first = [done[f"r0f{family}"].generation for family in range(FAMILIES)]
    assert all(g is not None and g.cached_ram_tokens == 0 and g.cached_disk_tokens == 0 for g in first)
    stats = cache.stats()
    assert stats.hits_ram == FAMILIES and stats.tokens_restored_ram == sum(g.cached_ram_tokens for g in second)
    assert stats.saves >= FAMILIES and stats.ram_bytes > 0


def test_without_the_cache_the_same_jobs_reuse_nothing_across_families(model_path, cold):
    """The baseline of the test above: the streams alone lose each start before it recurs."""
    model = _model(model_path)
    done = run_together(model, _requests())
    model.close()
    assert all(finished.generation == cold[key] for key, finished in done.items())
    # At most the few tokens every family's start begins with ("Q: what is 2 times").
    assert all(done[f"r1f{family}"].generation.cached_tokens < 16 for family in range(FAMILIES))


def test_a_ram_tier_too_small_for_every_start_evicts_starts_and_never_touches_a_live_sequence(model_path, cold):
    """RAM pressure on the tier (its bound holds about one ~120-token start, 23 KB a token):
    the least recently used starts go, every job still gives the text computed whole."""
    cache = PrefixCache(ram_limit_bytes=4 * MIB)
    model = _model(model_path, cache=cache)
    done = run_together(model, _requests())
    model.close()
    for key, finished in done.items():
        assert finished.generation == cold[key], key
    stats = cache.stats()
    assert stats.ram_evictions >= FAMILIES - 1 and 0 < stats.ram_bytes <= 4 * MIB
    assert stats.hits_ram < FAMILIES  # what was evicted was computed again


def test_a_fresh_context_restores_a_start_from_disk_and_gives_the_same_text(model_path, cold, tmp_path):
    """A worker restarted (a fresh context, a fresh cache over the same directory) finds the
    starts the last one saved as its context closed, and computes the same texts from them."""
    first_cache = PrefixCache.open(ram_limit_bytes=64 * MIB, disk_dir=tmp_path / "kv", disk_limit_bytes=256 * MIB)
    model = _model(model_path, cache=first_cache)
    first_round = {key: r for key, r in _requests().items() if key.startswith("r0")}
    run_together(model, first_round)
    model.close()  # the streams' last starts saved as it closes
    first_cache.close()  # and every save written to disk
    assert first_cache.stats().disk_entries >= FAMILIES

    cache = PrefixCache.open(ram_limit_bytes=64 * MIB, disk_dir=tmp_path / "kv", disk_limit_bytes=256 * MIB)
    model = _model(model_path, cache=cache)
    second_round = {key: r for key, r in _requests().items() if key.startswith("r1")}
    done = run_together(model, second_round)
    model.close()
    cache.close()
    for key, finished in done.items():
        assert finished.generation == cold[key], key
        assert finished.generation.cached_disk_tokens >= 100, key
    assert cache.stats().hits_disk == FAMILIES


def test_a_tenant_never_gets_another_tenants_start_from_a_stream_or_from_ram(model_path):
    cache = PrefixCache(ram_limit_bytes=64 * MIB)
    model = _model(model_path, cache=cache)
    request = GenerationParams.model_validate(_requests()["r0f0"])

    def cached(owner: str) -> int:
        decoder = model.decoder
        assert decoder is not None
        got = model.prepare(owner, request, _event(), None, owner=owner).admit()
        while decoder.active:
            decoder.step()
        return got

    assert cached("acme") == 0
    assert cached("globex") == 0  # acme's start is in a stream: not globex's
    assert cached("acme") >= 100  # ... and acme's own again
    # Both starts pushed out of the streams into RAM: each tenant gets back its own only.
    for family in (1, 2):
        admit(model, f"filler{family}", _requests()[f"r0f{family}"])
        while model.decoder is not None and model.decoder.active:
            model.decoder.step()
    assert cached("initech") == 0
    assert cached("globex") >= 100
    model.close()


def test_an_admin_may_share_a_models_cache_across_tenants(model_path):
    model = _model(model_path, shared_tenants=True)
    request = GenerationParams.model_validate(_requests()["r0f0"])
    decoder = model.decoder
    assert decoder is not None
    assert model.prepare("a", request, _event(), None, owner="acme").admit() == 0
    while decoder.active:
        decoder.step()
    assert model.prepare("b", request, _event(), None, owner="globex").admit() >= 100
    model.close()


def _event():
    import threading

    return threading.Event()
