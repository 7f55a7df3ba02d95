"""A worker's entry in the fleet's prefix index, on a real Redis: the hashes it publishes for
what its KV streams and RAM tier hold are the very chain the API computes for a job of the same
tenant (and never another tenant's), and each heartbeat sends what changed."""

from __future__ import annotations

from types import SimpleNamespace

from gpuq.jobs.prefix_routing import prefix_chain
from gpuq.prefix_blocks import cache_scope, model_fingerprint, namespace_salt
from gpuq.redis_keys import prefix_index_key
from worker.decoding.kv_streams import KvStreams
from worker.prefix_cache import CacheKey, PrefixCache
from worker.prefix_index import IndexPublisher, held_hashes

TOKENS = [1, *range(500, 700)]  # 201 tokens: 12 whole blocks


def _scope(model_path: str, owner: str) -> bytes:
    return namespace_salt(model_fingerprint(model_path), cache_scope(owner, shared=False))


def _model_holding(tokens: list[int], scope: bytes) -> SimpleNamespace:
    """A loaded model as the index reads it: its decoder's KV streams, one holding ``tokens``."""
    kv = KvStreams(2, chunk_tokens=64)
    kv.restored(0, tokens, scope)
    return SimpleNamespace(decoder=SimpleNamespace(kv=kv))


def test_what_a_stream_holds_is_published_as_the_chain_the_api_computes(model_path):
    held = held_hashes(None, [_model_holding(TOKENS, _scope(model_path, "alice"))])

    api = prefix_chain(model_path, "alice", [*TOKENS, 9, 9, 9], shared_tenants=False)
    assert set(api[:12]) <= held and len(held) == 12
    assert not set(prefix_chain(model_path, "bob", TOKENS, shared_tenants=False)) & held


def test_what_the_ram_tier_keeps_is_published_too(model_path):
    cache = PrefixCache(ram_limit_bytes=1 << 20)
    key = CacheKey(_scope(model_path, "alice"), b"L" * 16)
    cache.save(key, TOKENS, b"kv" * 100)
    cache.flush()

    held = held_hashes(cache, [])

    assert set(prefix_chain(model_path, "alice", TOKENS, shared_tenants=False)) == held
    cache.close()


def test_each_heartbeat_sends_what_was_gained_and_lost(redis):
    now: set[bytes] = {b"a" * 16, b"b" * 16}
    publisher = IndexPublisher("w1", lambda: set(now), ttl_s=30)
    key = prefix_index_key("w1")

    def send() -> None:
        with redis.pipeline(transaction=False) as pipe:
            publisher.send(pipe)
            pipe.execute()

    send()
    assert redis.smembers(key) == now and 0 < redis.ttl(key) <= 30
    now.discard(b"a" * 16)
    now.add(b"c" * 16)
    send()
    assert redis.smembers(key) == {b"b" * 16, b"c" * 16}
    redis.delete(key)  # Redis lost it: the next send after a failed one writes it whole
    publisher.forget()
    send()
    assert redis.smembers(key) == {b"b" * 16, b"c" * 16}
