"""The disk tier, by causing each fault: a truncated file, a flipped byte, a file of another
model, a worker SIGKILLed mid-save (a real process), a full disk (a real 1 MiB tmpfs); none
is ever served, and the tier's files outlive the process that wrote them."""

import json
import os
import shutil
import signal
import stat
import subprocess
import sys

import pytest

from tests.worker.prefix_cache.keys import entry, key, start
from worker.prefix_cache.cache import PrefixCache
from worker.prefix_cache.disk import SUFFIX, TEMP_PREFIX, DiskTier, encode, file_name

BIG = 1 << 30
FAMILY = start(1, 120)


def _files(directory):
    return sorted(p for p in directory.iterdir() if p.name.endswith(SUFFIX))


def test_a_saved_start_is_found_after_a_restart_in_a_private_directory(tmp_path):
    directory = tmp_path / "cache" / "kv"
    tier = DiskTier(directory, BIG)
    saved = entry(FAMILY)
    assert tier.put(saved)
    again = DiskTier(directory, BIG)  # the worker restarted: the index is rebuilt from the files
    name, shared = again.longest(key(), [*FAMILY, 1, 2, 3], limit=121)
    assert shared == 120
    loaded = again.load(name, key())
    assert loaded.tokens == saved.tokens and loaded.data == saved.data
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(directory.parent.stat().st_mode) == 0o700
    assert [stat.S_IMODE(p.stat().st_mode) for p in _files(directory)] == [0o600]


def test_a_truncated_file_is_deleted_at_start_and_never_served(tmp_path):
    DiskTier(tmp_path, BIG).put(entry(FAMILY))
    (path,) = _files(tmp_path)
    path.write_bytes(path.read_bytes()[:-100])
    tier = DiskTier(tmp_path, BIG)
    assert tier.longest(key(), FAMILY, limit=118) is None
    assert _files(tmp_path) == [] and tier.damaged == 1


def test_a_file_truncated_after_the_start_is_deleted_when_read(tmp_path):
    tier = DiskTier(tmp_path, BIG)
    tier.put(entry(FAMILY))
    (path,) = _files(tmp_path)
    path.write_bytes(path.read_bytes()[:-100])
    name, _ = tier.longest(key(), FAMILY, limit=118)
    assert tier.load(name, key()) is None
    assert _files(tmp_path) == [] and tier.longest(key(), FAMILY, limit=118) is None


@pytest.mark.parametrize("where", ["data", "tokens", "checksum"])
def test_a_flipped_byte_is_caught_by_the_checksum_and_the_file_deleted(tmp_path, where):
    tier = DiskTier(tmp_path, BIG)
    tier.put(entry(FAMILY))
    (path,) = _files(tmp_path)
    blob = bytearray(path.read_bytes())
    at = {"tokens": 52 + 4 * 100, "data": len(blob) // 2, "checksum": len(blob) - 1}[where]
    blob[at] ^= 0x10
    path.write_bytes(bytes(blob))
    name, _ = tier.longest(key(), FAMILY, limit=118)
    assert tier.load(name, key()) is None
    assert _files(tmp_path) == [] and tier.damaged == 1


def test_a_file_of_another_model_is_never_found_for_this_one(tmp_path):
    other_model = key(model=bytes(16))
    tier = DiskTier(tmp_path, BIG)
    tier.put(entry(FAMILY, other_model))
    assert DiskTier(tmp_path, BIG).longest(key(), FAMILY, limit=118) is None
    assert DiskTier(tmp_path, BIG).longest(other_model, FAMILY, limit=118) is not None
    # A file whose header was rewritten to claim this model fails its checksum.
    (path,) = _files(tmp_path)
    blob = bytearray(path.read_bytes())
    blob[8:24] = key().namespace
    path.write_bytes(bytes(blob))
    tier = DiskTier(tmp_path, BIG)
    name, _ = tier.longest(key(), FAMILY, limit=118)
    assert tier.load(name, key()) is None
    assert _files(tmp_path) == []


def test_the_bound_prunes_the_least_recently_used_files_across_restarts(tmp_path):
    one = len(encode(entry(start(1, 64))))
    tier = DiskTier(tmp_path, 3 * one)
    for family in (1, 2, 3):
        tier.put(entry(start(family, 64)))
    name, _ = tier.longest(key(), start(1, 64), limit=62)
    tier.load(name, key())  # family 1 read again: family 2 is the oldest
    tier.put(entry(start(4, 64)))
    assert tier.entries == 3 and tier.used_bytes <= 3 * one and len(_files(tmp_path)) == 3
    assert tier.longest(key(), start(2, 64), limit=62) is None
    # The order outlives the process in the files' modification times (a read touches its file);
    # set here a second apart, as a day's runs leave them.
    for family, second in ((3, 1), (1, 2), (4, 3)):
        os.utime(tmp_path / file_name(key(), start(family, 64)), ns=(second * 10**9, second * 10**9))
    restarted = DiskTier(tmp_path, 2 * one)  # a smaller bound at the next start: the oldest goes
    assert restarted.entries == 2
    assert restarted.longest(key(), start(3, 64), limit=62) is None
    assert restarted.longest(key(), start(1, 64), limit=62) is not None
    assert restarted.longest(key(), start(4, 64), limit=62) is not None


CHILD_KILLED_MID_SAVE = """
import os, sys, time
from pathlib import Path
from tests.worker.prefix_cache.keys import entry, start
from worker.prefix_cache import disk

tier = disk.DiskTier(Path(sys.argv[1]), 1 << 30)
tier.put(entry(start(1, 64)))

def stall(*_args):
    print("saving", flush=True)
    time.sleep(600)

if sys.argv[2] == "write":  # killed with half the file written
    real_open = disk.open_private
    class Half:
        def __init__(self, f): self.f = f
        def __enter__(self): return self
        def __exit__(self, *a): self.f.close()
        def write(self, blob):
            self.f.write(blob[: len(blob) // 2]); self.f.flush(); stall()
    disk.open_private = lambda path, **kw: Half(real_open(path, **kw))
else:  # killed with the whole file written, before its fsync and rename
    os.fsync = stall
tier.put(entry(start(2, 64), size=2_000_000))
"""


@pytest.mark.parametrize("stage", ["write", "fsync"])
def test_a_worker_killed_mid_save_leaves_no_file_that_is_served(tmp_path, stage):
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD_KILLED_MID_SAVE, str(tmp_path), stage], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "saving"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=30)
    assert any(p.name.startswith(TEMP_PREFIX) for p in tmp_path.iterdir())  # the save was cut short
    tier = DiskTier(tmp_path, BIG)
    assert tier.longest(key(), start(2, 64), limit=62) is None
    assert tier.longest(key(), start(1, 64), limit=62) is not None
    assert not any(p.name.startswith(TEMP_PREFIX) for p in tmp_path.iterdir())  # cleaned at start


CHILD_DISK_FULL = """
import json, logging, sys
from pathlib import Path
from tests.worker.prefix_cache.keys import key, start, state
from worker.prefix_cache.cache import PrefixCache

warnings = []
class Catch(logging.Handler):
    def emit(self, record):
        if record.levelno >= logging.WARNING:
            warnings.append(record.getMessage())
logging.getLogger("worker.prefix_cache").addHandler(Catch())
cache = PrefixCache.open(ram_limit_bytes=1 << 30, disk_dir=Path(sys.argv[1]) / "kv", disk_limit_bytes=1 << 30)
for family in range(8):  # 300 kB each on a 1 MiB disk
    tokens = start(family, 64)
    cache.save(key(), tokens, state(tokens, 300_000))
    cache.flush()
found = [cache.lookup(key(), start(family, 64), limit=62) for family in range(8)]
stats = cache.stats()
cache.close()
names = [p.name for p in (Path(sys.argv[1]) / "kv").iterdir()]
print(json.dumps({"warnings": warnings, "tiers": [f and f.tier for f in found], "disk_enabled": stats.disk_enabled,
                  "disk_entries": stats.disk_entries, "names": names}))
"""


def test_a_full_disk_turns_the_disk_tier_off_with_one_warning_and_the_ram_tier_goes_on(tmp_path):
    """On a real 1 MiB tmpfs, mounted in a private mount namespace (``unshare``: no root
    needed where user namespaces are allowed), so the tier's own write path meets ENOSPC."""
    if shutil.which("unshare") is None:
        pytest.fail("this test needs util-linux's unshare to mount a tiny tmpfs")
    mount = tmp_path / "small"
    mount.mkdir()
    script = 'mount -t tmpfs -o size=1m tmpfs "$1" && exec "$2" -c "$3" "$1"'
    out = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, "sh", str(mount), sys.executable, CHILD_DISK_FULL],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert len(result["warnings"]) == 1 and "full" in result["warnings"][0]
    assert result["disk_enabled"] is False
    assert result["tiers"] == ["ram"] * 8  # every start still found, in RAM
    assert 1 <= result["disk_entries"] <= 3
    assert not any(n.startswith(TEMP_PREFIX) for n in result["names"])  # the failed write left nothing


def test_a_start_written_through_to_disk_is_found_by_the_next_process_and_read_into_ram(tmp_path):
    first = PrefixCache.open(ram_limit_bytes=BIG, disk_dir=tmp_path, disk_limit_bytes=BIG)
    first.save(key(), FAMILY, b"cells" * 1000)
    first.close()
    second = PrefixCache.open(ram_limit_bytes=BIG, disk_dir=tmp_path, disk_limit_bytes=BIG)
    prompt = [*FAMILY[:90], 4, 4, 4]
    found = second.lookup(key(), prompt, limit=len(prompt) - 2)
    assert (found.tier, found.tokens, found.entry.data) == ("disk", 90, b"cells" * 1000)
    with second.restoring(found):
        second.restored(found, ok=True)
    again = second.lookup(key(), prompt, limit=len(prompt) - 2)
    assert again.tier == "ram"
    assert second.lookup(key("globex"), prompt, limit=len(prompt) - 2) is None
    stats = second.stats()
    assert (stats.hits_disk, stats.hits_ram, stats.misses, stats.tokens_restored_disk) == (1, 1, 1, 90)
    assert (stats.disk_entries, stats.ram_entries) == (1, 1)
    second.close()
