"""Checks what docs/architecture.md names against the code, for `make lint`.

Every path it names in backticks exists; every setting (``GPUQ_*``) is a field of
``gpuq.settings.Settings``; every Redis key (``gpuq:...``) is named in ``gpuq/redis_keys.py``.
Prints one line per claim that no longer holds and exits 1 if there is any.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROOTS = ("gpuq/", "api/", "worker/", "tests/", "bench/", "docs/", "scripts/", "migrations/", "monitoring/")
_CODE = re.compile(r"`([^`\n]+)`")
_PATH = re.compile(r"^(?:" + "|".join(map(re.escape, ROOTS)) + r")[\w./-]*$")
_SETTING = re.compile(r"\bGPUQ_[A-Z0-9_]*[A-Z0-9]\b")
_REDIS_KEY = re.compile(r"^gpuq:[\w<>:.-]+$")


def _settings() -> set[str]:
    sys.path.insert(0, str(ROOT))
    from gpuq.settings import ENV_PREFIX, OTHER_VARIABLES, Settings

    return {ENV_PREFIX + name.upper() for name in Settings.model_fields} | OTHER_VARIABLES


def problems(document: Path, root: Path = ROOT) -> list[str]:
    text = document.read_text()
    settings = _settings()
    redis_keys = (root / "gpuq" / "redis_keys.py").read_text()
    found = []
    for code in _CODE.findall(text):
        if _PATH.match(code) and not (root / code).exists():
            found.append(f"{document.name}: names {code}, which does not exist")
        if _REDIS_KEY.match(code):
            for part in code.split(":")[1:]:
                if not part.startswith("<") and part not in redis_keys:
                    found.append(f"{document.name}: names the Redis key {code}, not in gpuq/redis_keys.py")
                    break
    for setting in sorted(set(_SETTING.findall(text))):
        if setting not in settings and not setting.startswith("GPUQ_TEST"):  # GPUQ_TEST_*: the suite's
            found.append(f"{document.name}: names {setting}, which gpuq/settings.py does not define")
    return found


def main(argv: list[str]) -> int:
    documents = [Path(a) for a in argv] or [ROOT / "docs" / "architecture.md"]
    found = [line for document in documents for line in problems(document)]
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
