"""Registering models: a name for a GGUF file under the models directory, with its kinds.

Validation happens here so the API and the CLI refuse the same things with the same words.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from sqlalchemy.orm import Session

from gpuq import store
from gpuq.db.tables import Model, ModelKind
from gpuq.fleet.vram import ModelShape, VramEstimate, estimate_embedding, estimate_generation
from gpuq.queue_names import is_valid_model_name
from gpuq.registry.bundled import (
    BUNDLED_CONTEXT_LENGTH,
    BUNDLED_MODEL_NAME,
    SECOND_CONTEXT_LENGTH,
    SECOND_MODEL_NAME,
    bundled_model_path,
    second_model_path,
)
from gpuq.registry.gguf import NotAGgufFile, read_metadata
from gpuq.settings import get_settings


class InvalidModel(ValueError):
    """The registration asked for is impossible; the message says why."""


def resolve_model_path(models_dir: Path, path: str) -> Path:
    """A relative path is taken inside ``models_dir``; either way it must stay inside it.

    Checked on the path as written (``..`` cannot climb out), not on where symlinks
    lead: a symlink an admin placed in the models directory is a deliberate choice."""
    root = Path(os.path.abspath(models_dir))
    full = Path(os.path.normpath(root / path))
    if not full.is_relative_to(root):
        raise InvalidModel(f"model path {path!r} is outside the models directory {root}")
    if not full.is_file():
        relative = "" if os.path.isabs(path) else f" (a relative path is read inside the models directory {root})"
        raise InvalidModel(f"model file {full} does not exist{relative}")
    return full


def gpu_slots() -> int:
    """K, the sequences a GPU worker's generation context holds: workers read the same settings."""
    return get_settings().slots_for(on_gpu=True)


def estimates_for_kinds(shape: ModelShape, *, n_ctx: int, kinds: set[ModelKind], slots: int) -> list[VramEstimate]:
    """The contexts a worker may load for this model's kinds (see ``gpuq/fleet/vram.py``)."""
    estimates = []
    if ModelKind.GENERATE in kinds:
        estimates.append(estimate_generation(shape, n_ctx=n_ctx, slots=slots))
    if ModelKind.EMBED in kinds:
        estimates.append(estimate_embedding(shape, n_ctx=n_ctx))
    return estimates


def estimate_for_kinds(shape: ModelShape, *, n_ctx: int, kinds: set[ModelKind], slots: int) -> VramEstimate:
    """The largest of the contexts a worker may load for this model's kinds.

    One figure serves both kinds: placement must find a GPU that holds either context, and a
    worker's cache counts the figure once per context it loads."""
    return max(estimates_for_kinds(shape, n_ctx=n_ctx, kinds=kinds, slots=slots), key=lambda e: e.total_mib)


def vram_basis(model: Model, slots: int) -> str:
    """What a model's VRAM figure counts, in words for the placement preview."""
    if model.vram_override_mib is not None:
        return "measured by an admin"
    contexts = []
    if model.can_generate:
        contexts.append(f"generation with K={slots} sequences of {model.context_length} tokens")
    if model.can_embed:
        contexts.append(f"embeddings in {model.context_length}-token batches")
    return "estimate for " + " or ".join(contexts) + (", whichever needs more" if len(contexts) > 1 else "")


def build_model(
    *,
    name: str,
    path: Path,
    kinds: set[ModelKind],
    context_length: int | None,
    vram_override_mib: int | None = None,
    slots: int | None = None,
) -> Model:
    """A model row with its VRAM estimate for the registered context and ``slots`` sequences per
    generation context (K; None: this process's ``GPUQ_WORKER_SLOTS`` on a GPU, see ``gpu_slots``).
    ``vram_override_mib`` is an admin's measured figure, which placement then uses instead."""
    if not is_valid_model_name(name):
        raise InvalidModel(f"model name {name!r} is invalid: use letters, digits, '.', '_' or '-' (at most 128)")
    if not kinds:
        raise InvalidModel("a model needs at least one kind: generate and/or embed")
    try:
        meta = read_metadata(path)
    except NotAGgufFile as exc:
        raise InvalidModel(str(exc)) from None
    n_ctx = context_length or min(meta.context_length, 4096)
    if not 1 <= n_ctx <= meta.context_length:
        raise InvalidModel(
            f"context_length {n_ctx} is out of range: the model was trained for at most {meta.context_length}"
        )
    estimates = estimates_for_kinds(meta.shape, n_ctx=n_ctx, kinds=kinds, slots=slots or gpu_slots())
    return Model(
        name=name,
        path=str(path),
        can_generate=ModelKind.GENERATE in kinds,
        can_embed=ModelKind.EMBED in kinds,
        context_length=n_ctx,
        context_length_trained=meta.context_length,
        size_bytes=meta.size_bytes,
        architecture=meta.architecture,
        vram_estimate_mib=math.ceil(max(e.total_mib for e in estimates)),
        vram_override_mib=vram_override_mib,
        # Each further GPU of a group pays the larger per-GPU part of the kinds' contexts.
        vram_per_gpu_mib=math.ceil(max(e.per_gpu_mib for e in estimates)),
    )


def register_bundled_model(session: Session, *, slots: int | None = None) -> Model | None:
    """Register SmolLM2 once; leaves an existing registration of that name alone."""
    return _register_shipped(session, BUNDLED_MODEL_NAME, bundled_model_path(), BUNDLED_CONTEXT_LENGTH, slots)


def register_second_model(session: Session, directory: Path, *, slots: int | None = None) -> Model | None:
    """Register Gemma 3 270M once, its file joined into ``directory``, if its package is installed."""
    if store.get_model(session, SECOND_MODEL_NAME) is not None:
        return None
    return _register_shipped(session, SECOND_MODEL_NAME, second_model_path(directory), SECOND_CONTEXT_LENGTH, slots)


def _register_shipped(
    session: Session, name: str, path: Path | None, context_length: int, slots: int | None
) -> Model | None:
    if path is None or store.get_model(session, name) is not None:
        return None
    model = build_model(
        name=name, path=path, kinds={ModelKind.GENERATE, ModelKind.EMBED}, context_length=context_length, slots=slots
    )
    return store.save_model(session, model)
