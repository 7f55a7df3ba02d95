"""What gpuq needs to know about a GGUF file, read from its header with the ``gguf`` package.

A file that is not GGUF, or is truncated or corrupt, is refused with :class:`NotAGgufFile`
and a sentence that says so, never with the parser's own exception: registration turns it
into a 422 (API) or a one-line error (CLI). Some architectures store a count per layer
(``head_count_kv`` of OpenELM, say) rather than one number; those are read as per-layer
tuples (the KV estimate sums them) or, where one number is needed, their largest.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from gpuq.fleet.vram import ModelShape

GGUF_MAGIC = b"GGUF"


class NotAGgufFile(ValueError):
    """The file is not a GGUF file gpuq can read: no GGUF magic, truncated, or corrupt."""


# Header keys an estimate cannot do without (each under the file's architecture).
REQUIRED_KEYS = ("block_count", "embedding_length", "attention.head_count")


@dataclass(frozen=True, slots=True)
class GgufMetadata:
    architecture: str
    name: str
    context_length: int
    embedding_length: int
    block_count: int
    head_count: int
    head_count_kv: int | tuple[int, ...]
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
    try:
        return _read_metadata(str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    except NotAGgufFile:
        raise
    except Exception as exc:  # whatever the parser trips on in a damaged file: the file is the problem
        raise NotAGgufFile(
            f"{path} cannot be read as GGUF: it is truncated or corrupt ({type(exc).__name__}: {exc})"
        ) from None


def _per_layer(value: Any) -> int | tuple[int, ...]:
    """A count the header holds once, or once per layer."""
    if isinstance(value, list | tuple):
        counts = tuple(int(v) for v in value)
        return counts[0] if len(set(counts)) == 1 else counts
    return int(value)


def _largest(value: int | tuple[int, ...]) -> int:
    return max(value) if isinstance(value, tuple) else value


@lru_cache(maxsize=64)
def _read_metadata(path_str: str, _size: int, _mtime_ns: int) -> GgufMetadata:
    """Cached by file identity: GGUFReader maps every tensor, which takes seconds on a big file."""
    from gguf import GGUFReader  # imported late: it pulls numpy, which the CLI rarely needs

    path = Path(path_str)
    reader = GGUFReader(path)
    arch = _field_value(reader, "general.architecture") or "unknown"

    missing = [f"{arch}.{key}" for key in REQUIRED_KEYS if _field_value(reader, f"{arch}.{key}") is None]
    if missing:
        raise NotAGgufFile(f"{path} lacks GGUF metadata an estimate needs: {', '.join(missing)}")

    def arch_value(key: str, default: int | tuple[int, ...] = 0) -> int | tuple[int, ...]:
        value = _field_value(reader, f"{arch}.{key}")
        return _per_layer(value) if value is not None else default

    def arch_int(key: str, default: int = 0) -> int:
        return _largest(arch_value(key, default))

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
        head_count_kv=arch_value("attention.head_count_kv", heads),
        key_length=arch_int("attention.key_length", head_size),
        value_length=arch_int("attention.value_length", head_size),
        vocab_size=arch_int("vocab_size", len(tokens.data) if tokens is not None else 0),
        chat_template=_field_value(reader, "tokenizer.chat_template"),
        size_bytes=path.stat().st_size,
        weights_bytes=sum(int(t.n_bytes) for t in reader.tensors),
    )
