"""Embedding vectors as the drop-in APIs hand them out: shortened, base64-encoded."""

from __future__ import annotations

import base64
import struct

from gpuq.db.tables import Model
from gpuq.dropin.models import embedding_length
from gpuq.errors import RequestError


async def check_dimensions(model: Model, dimensions: int | None) -> None:
    """Refuse ``dimensions`` longer than the model's vectors before any job embeds anything."""
    if dimensions is None:
        return
    length = await embedding_length(model)
    if length is not None and dimensions > length:
        raise RequestError(
            400, f"dimensions is {dimensions} but {model.name!r} makes vectors of {length}", param="dimensions"
        )


def shortened(vectors: list[list[float]], dimensions: int | None) -> list[list[float]]:
    """The first ``dimensions`` of each vector, normalised again (as OpenAI's ``dimensions``
    and Ollama's do), so cosine similarity still reads as one."""
    if dimensions is None:
        return vectors
    if vectors and dimensions > len(vectors[0]):
        raise RequestError(
            400, f"dimensions is {dimensions} but the model's vectors have {len(vectors[0])}", param="dimensions"
        )
    out = []
    for vector in vectors:
        head = vector[:dimensions]
        norm = sum(x * x for x in head) ** 0.5
        out.append([x / norm for x in head] if norm > 0 else head)
    return out


def as_base64(vector: list[float]) -> str:
    """OpenAI's ``encoding_format: base64``: little-endian float32s (what the openai client decodes)."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
