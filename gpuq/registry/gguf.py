"""What gpuq needs to know about a GGUF file, read from its header with the ``gguf`` package."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from gpuq.fleet.vram import ModelShape

GGUF_MAGIC = b"GGUF"


class NotAGgufFile(ValueError):
    """The file does not start with the GGUF magic bytes."""


@dataclass(frozen=True, slots=True)
class GgufMetadata:
    architecture: str
    name: str
    context_length: int
    embedding_length: int
    block_count: int
    head_count: int
    head_count_kv: int
    key_length: int
    value_length: int
    vocab_size: int
    chat_template: str | None
    size_bytes: int
    weights_bytes: int

    @property
    def shape(self) -> ModelShape:
        return ModelShape(
            weights_bytes=self.weights_bytes,
            block_count=self.block_count,
            embedding_length=self.embedding_length,
            head_count=self.head_count,
            head_count_kv=self.head_count_kv,
            key_length=self.key_length,
            value_length=self.value_length,
            vocab_size=self.vocab_size,
        )


def is_gguf(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def _field_value(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return None
    return field.contents()


def read_metadata(path: Path) -> GgufMetadata:
    if not is_gguf(path):
        raise NotAGgufFile(f"{path} is not a GGUF file (it does not start with the GGUF magic bytes)")
    stat = path.stat()
    return _read_metadata(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=64)
def _read_metadata(path_str: str, _size: int, _mtime_ns: int) -> GgufMetadata:
    """Cached by file identity: GGUFReader maps every tensor, which takes seconds on a big file."""
    from gguf import GGUFReader  # imported late: it pulls numpy, which the CLI rarely needs

    path = Path(path_str)
    reader = GGUFReader(path)
    arch = _field_value(reader, "general.architecture") or "unknown"

    def arch_int(key: str, default: int = 0) -> int:
        value = _field_value(reader, f"{arch}.{key}")
        return int(value) if value is not None else default

    heads = arch_int("attention.head_count")
    embedding = arch_int("embedding_length")
    head_size = embedding // heads if heads else 0
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    return GgufMetadata(
        architecture=arch,
        name=_field_value(reader, "general.name") or path.stem,
        context_length=arch_int("context_length", 2048),
        embedding_length=embedding,
        block_count=arch_int("block_count"),
        head_count=heads,
        head_count_kv=arch_int("attention.head_count_kv", heads),
        key_length=arch_int("attention.key_length", head_size),
        value_length=arch_int("attention.value_length", head_size),
        vocab_size=arch_int("vocab_size", len(tokens.data) if tokens is not None else 0),
        chat_template=_field_value(reader, "tokenizer.chat_template"),
        size_bytes=path.stat().st_size,
        weights_bytes=sum(int(t.n_bytes) for t in reader.tensors),
    )
