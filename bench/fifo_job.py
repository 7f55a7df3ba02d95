"""The model-swap baseline's job: a plain RQ function that keeps the last model it loaded
(room for one, like a GPU that fits one) and loads whatever the job names."""

from __future__ import annotations

from typing import Any

_loaded: dict[str, Any] = {}


def generate(model: str, path: str, prompt: str) -> bool:
    """Runs one job; returns whether it had to load the model."""
    import llama_cpp

    loaded = model not in _loaded
    if loaded:
        for old in list(_loaded):
            _loaded.pop(old).close()
        _loaded[model] = llama_cpp.Llama(model_path=path, n_ctx=2048, n_threads=1, n_threads_batch=1, verbose=False)
    _loaded[model].create_completion(prompt, max_tokens=1, temperature=0.0)
    return loaded
