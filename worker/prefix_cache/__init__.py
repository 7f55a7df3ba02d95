"""Prompt starts kept beyond the decoder's KV streams: in host RAM and in a directory.

``key.py`` (what makes saved KV fit a context), ``entry.py`` (a saved start, and the index
that finds the longest one a prompt shares), ``ram.py`` and ``disk.py`` (the tiers),
``cache.py`` (both behind one object, with their figures). The bytes are a stream's cells as
``worker/decoding/kv_state.py`` saves and restores them; ``worker/decoding/prefix_tier.py`` is
the decoder's side (what it saves when, what it restores).
"""

from worker.prefix_cache.cache import Found, PrefixCache, PrefixCacheStats, mem_available_bytes, ram_limit_bytes
from worker.prefix_cache.disk import DiskTier
from worker.prefix_cache.key import CacheKey, KvLayout

__all__ = [
    "CacheKey",
    "DiskTier",
    "Found",
    "KvLayout",
    "PrefixCache",
    "PrefixCacheStats",
    "mem_available_bytes",
    "ram_limit_bytes",
]
