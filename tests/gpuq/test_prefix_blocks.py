"""A prompt's start as block hashes: the values the API computes for the fleet's prefix index
and the workers publish, so the same in every process, and apart for tenants and models."""

import json
import os
import subprocess
import sys

from gpuq.prefix_blocks import (
    BLOCK_TOKENS,
    FINGERPRINT_WINDOW_BYTES,
    block_hashes,
    cache_scope,
    model_fingerprint,
    namespace_salt,
)

FINGERPRINT = bytes(range(16))
SALT = namespace_salt(FINGERPRINT, cache_scope("acme", shared=False))
PROMPT = list(range(1000, 1000 + 5 * BLOCK_TOKENS + 7))  # five whole blocks and a partial one


def test_two_prompts_share_the_hashes_of_exactly_the_whole_blocks_they_share():
    other = PROMPT[: 2 * BLOCK_TOKENS + 5] + [7] * 60
    a, b = block_hashes(PROMPT, SALT), block_hashes(other, SALT)
    assert len(a) == 5  # the partial last block is not hashed
    assert a[:2] == b[:2]
    assert not set(a[2:]) & set(b)  # from the first differing block on, every hash differs (chained)


def test_a_block_hash_names_the_whole_start_not_the_block_alone():
    moved = [1, *PROMPT[1:]]  # only the first token differs
    assert not set(block_hashes(PROMPT, SALT)) & set(block_hashes(moved, SALT))


def test_tenants_models_and_a_shared_scope_salt_the_chain():
    theirs = namespace_salt(FINGERPRINT, cache_scope("globex", shared=False))
    no_owner = namespace_salt(FINGERPRINT, cache_scope(None, shared=False))
    other_model = namespace_salt(bytes(16), cache_scope("acme", shared=False))
    mine = set(block_hashes(PROMPT, SALT))
    for salt in (theirs, no_owner, other_model):
        assert not mine & set(block_hashes(PROMPT, salt))
    shared = [namespace_salt(FINGERPRINT, cache_scope(owner, shared=True)) for owner in ("acme", "globex", None)]
    assert len(set(shared)) == 1


def test_hashes_are_the_same_in_another_process_and_pinned_by_value():
    """Python's own hash() is salted per process; these must not be (a worker publishes what
    the API computes). The pinned value guards the scheme: changing it is a protocol change."""
    code = (
        "import json,sys; from gpuq.prefix_blocks import *; "
        f"s=namespace_salt(bytes(range(16)), cache_scope('acme', shared=False)); "
        f"print(json.dumps([h.hex() for h in block_hashes({PROMPT!r}, s)]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=os.environ | {"PYTHONHASHSEED": "12345"}, capture_output=True, check=True
    )
    assert json.loads(out.stdout) == [h.hex() for h in block_hashes(PROMPT, SALT)]
    assert block_hashes(PROMPT, SALT)[0].hex() == "a1a7723b80844a0d59ce80556615f16a"


def test_a_model_file_fingerprint_follows_its_bytes_not_its_path(tmp_path):
    data = bytearray(os.urandom(40 * FINGERPRINT_WINDOW_BYTES))
    a, copy = tmp_path / "a.gguf", tmp_path / "sub-copy.gguf"
    a.write_bytes(data)
    copy.write_bytes(data)
    assert model_fingerprint(str(a)) == model_fingerprint(str(copy))
    data[-1] ^= 1  # a fine-tune of the same shape: the same size, other weights
    tuned = tmp_path / "tuned.gguf"
    tuned.write_bytes(data)
    assert model_fingerprint(str(tuned)) != model_fingerprint(str(a))
    longer = tmp_path / "longer.gguf"
    longer.write_bytes(bytes(data) + b"\0")
    assert model_fingerprint(str(longer)) not in (model_fingerprint(str(a)), model_fingerprint(str(tuned)))
