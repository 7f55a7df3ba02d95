"""scripts/check_docs.py, which `make lint` runs: the architecture document names only what exists."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _check_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_docs", ROOT / "scripts" / "check_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_architecture_document_names_only_what_exists() -> None:
    assert _check_docs().problems(ROOT / "docs" / "architecture.md") == []


def test_a_missing_path_an_unknown_setting_and_an_unknown_redis_key_are_each_reported(tmp_path: Path) -> None:
    document = tmp_path / "architecture.md"
    document.write_text(
        "The store (`gpuq/store/jobs.py`) and `gpuq/nowhere.py`; `GPUQ_WORKER_TTL_S` and `GPUQ_NO_SUCH_S`;"
        " keys `gpuq:cancel:<job>` and `gpuq:no-such-key:<job>`; `GPUQ_TEST_*` and `GPUQ_API_URL`.\n"
    )
    found = _check_docs().problems(document)
    assert found == [
        "architecture.md: names gpuq/nowhere.py, which does not exist",
        "architecture.md: names the Redis key gpuq:no-such-key:<job>, not in gpuq/redis_keys.py",
        "architecture.md: names GPUQ_NO_SUCH_S, which gpuq/settings.py does not define",
    ]
