"""The host-RAM tier: the longest saved start a prompt shares, a bound in bytes kept by evicting
the least recently used start, never one being restored, and one tenant's starts invisible
to another."""

import threading

from tests.worker.prefix_cache.keys import entry, key, start
from worker.prefix_cache.ram import RamTier

BIG = 1 << 30


def test_the_longest_shared_start_wins_down_to_the_token_and_within_the_limit():
    ram = RamTier(BIG)
    family = start(1, 100)
    ram.put(entry(family))
    ram.put(entry(family[:40] + start(2, 60)))  # shares 40 tokens (two blocks and 8) with the first
    prompt = [*family[:57], 5, 5, 5, 5]
    found = ram.longest(key(), prompt, limit=len(prompt) - 2)
    assert found is not None
    saved, shared = found
    assert shared == 57  # three whole blocks, then the partial block compared token by token
    assert saved.tokens == tuple(family)
    assert ram.longest(key(), prompt, limit=50)[1] == 50
    assert ram.longest(key(), start(3, 80), limit=78) is None  # nothing shares a block
    assert ram.longest(key(), family[:20], limit=10) is None  # under a block is never worth a restore


def test_another_tenant_or_model_finds_nothing_unless_the_cache_is_shared():
    ram = RamTier(BIG)
    family = start(1, 100)
    ram.put(entry(family, key("acme")))
    assert ram.longest(key("acme"), family, limit=98) is not None
    assert ram.longest(key("globex"), family, limit=98) is None
    assert ram.longest(key(None), family, limit=98) is None
    assert ram.longest(key("acme", model=bytes(16)), family, limit=98) is None
    ram.put(entry(family, key("acme", shared=True)))
    assert ram.longest(key("globex", shared=True), family, limit=98) is not None


def test_the_bound_evicts_the_least_recently_used_start_first():
    one = entry(start(1, 64)).size
    ram = RamTier(3 * one)
    for family in (1, 2, 3):
        assert ram.put(entry(start(family, 64)))
    ram.longest(key(), start(1, 64), limit=62)  # family 1 used again: family 2 is now the oldest
    assert ram.put(entry(start(4, 64)))
    assert ram.used_bytes <= ram.limit_bytes and ram.entries == 3
    assert ram.longest(key(), start(2, 64), limit=62) is None
    for family in (1, 3, 4):
        assert ram.longest(key(), start(family, 64), limit=62) is not None
    assert ram.evictions == 1


def test_a_start_being_restored_is_never_evicted():
    one = entry(start(1, 64)).size
    ram = RamTier(2 * one)
    ram.put(entry(start(1, 64)))
    ram.put(entry(start(2, 64)))
    saved, _ = ram.longest(key(), start(1, 64), limit=62)
    ram.longest(key(), start(2, 64), limit=62)  # family 1 is the least recently used
    with ram.pinned(saved):
        assert ram.put(entry(start(3, 64)))
        assert ram.longest(key(), start(1, 64), limit=62) is not None  # pinned: family 2 went
        assert ram.longest(key(), start(2, 64), limit=62) is None
        # Only pinned starts left to evict besides the new one: a start that does not fit is refused.
        assert not ram.put(entry(start(4, 64), size=2 * one))
    assert ram.used_bytes <= ram.limit_bytes


def test_a_longer_start_replaces_the_saved_starts_it_covers_and_a_covered_one_is_not_kept():
    ram = RamTier(BIG)
    family = start(1, 200)
    assert ram.put(entry(family[:64]))
    assert ram.put(entry(family))
    assert ram.entries == 1
    assert not ram.put(entry(family[:100]))  # already covered
    assert ram.entries == 1
    assert ram.longest(key(), family[:100], limit=98)[1] == 98


def test_threads_saving_and_looking_up_together_keep_the_bound_and_the_count():
    one = entry(start(1, 64)).size
    ram = RamTier(10 * one)

    def work(offset):
        for i in range(200):
            family = offset + i % 30
            ram.put(entry(start(family, 64)))
            ram.longest(key(), start(family, 70), limit=68)

    threads = [threading.Thread(target=work, args=(n * 100,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert ram.used_bytes <= ram.limit_bytes
    assert ram.entries == 10
    assert ram.used_bytes == 10 * one
