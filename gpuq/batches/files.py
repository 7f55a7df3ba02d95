"""Batch files on disk, described in SQL (OpenAI's ``/v1/files``).

An upload is streamed to disk a chunk at a time and checked line by line as it goes (JSON,
a unique ``custom_id``, ``POST`` to a known endpoint, a body naming a model), so a 200 MB
file is never held in memory. A file with bad lines is refused whole, with the line
numbers, and nothing is kept. Deleting a file removes its row, then its bytes.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from gpuq import store
from gpuq.batches.openai_format import ENDPOINTS
from gpuq.db.tables import File, utcnow
from gpuq.errors import RequestError

PURPOSE_BATCH = "batch"
PURPOSE_OUTPUT = "batch_output"
MAX_ERRORS_REPORTED = 20
MAX_LINES = 50_000


def new_file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


def files_dir(data_dir: Path) -> Path:
    path = data_dir / "files"
    path.mkdir(parents=True, exist_ok=True)
    return path


def check_line(raw: bytes, seen: set[str]) -> str | None:
    """Why a batch line is malformed, or None. Records its custom_id in ``seen``."""
    try:
        line = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return f"not valid JSON ({exc.msg if isinstance(exc, json.JSONDecodeError) else 'bad UTF-8'})"
    if not isinstance(line, dict):
        return "each line must be a JSON object"
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return "`custom_id` must be a non-empty string"
    if custom_id in seen:
        return f"custom_id {custom_id!r} is used twice; each must be unique"
    seen.add(custom_id)
    if line.get("method") != "POST":
        return "`method` must be POST"
    if line.get("url") not in ENDPOINTS:
        return f"unknown endpoint {line.get('url')!r}; use one of {', '.join(ENDPOINTS)}"
    body = line.get("body")
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        return "`body` must be an object with a `model`"
    return None


@dataclass
class LineScanner:
    """Checks lines as chunks arrive; keeps only the custom_ids, not the lines."""

    seen: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    lines: int = 0
    number: int = 0
    _partial: bytes = b""

    def feed(self, chunk: bytes) -> None:
        data = self._partial + chunk
        *complete, self._partial = data.split(b"\n")
        for raw in complete:
            self._check(raw)

    def finish(self) -> None:
        if self._partial.strip():
            self._check(self._partial)
        self._partial = b""

    def _check(self, raw: bytes) -> None:
        self.number += 1
        if not raw.strip():
            return
        self.lines += 1
        problem = check_line(raw, self.seen)
        if problem is not None:
            self.errors.append(f"line {self.number}: {problem}")


def delete_stored_file(session: Session, file: File) -> None:
    """The file's row, then its bytes (a row without bytes would be worse than bytes without
    a row). A file a schedule reads from stays: its next runs would fail."""
    readers = store.schedules_reading_file(session, file.id)
    if readers:
        names = ", ".join(repr(s.name) for s in readers)
        raise RequestError(
            409, f"file {file.id} is the input of schedule {names}; delete the schedule or give it another file first"
        )
    if store.delete_file(session, file.id):
        Path(file.path).unlink(missing_ok=True)


async def store_upload(chunks: AsyncIterator[bytes], *, filename: str, purpose: str, directory: Path) -> File:
    """Stream an upload to disk, checking it; returns the (unsaved) File row."""
    if purpose != PURPOSE_BATCH:
        raise RequestError(400, f"purpose {purpose!r} is not supported; gpuq stores files with purpose 'batch'")
    file_id = new_file_id()
    final = directory / f"{file_id}.jsonl"
    partial = directory / f".{file_id}.part"
    scanner = LineScanner()
    size = 0
    try:
        with partial.open("wb") as out:
            async for chunk in chunks:
                scanner.feed(chunk)
                out.write(chunk)
                size += len(chunk)
                if scanner.lines > MAX_LINES:
                    raise RequestError(400, f"the file has more than {MAX_LINES} lines; split it into several batches")
        scanner.finish()
        if scanner.errors:
            shown = "; ".join(scanner.errors[:MAX_ERRORS_REPORTED])
            more = len(scanner.errors) - MAX_ERRORS_REPORTED
            raise RequestError(
                400,
                f"invalid batch file, {len(scanner.errors)} bad lines: {shown}"
                + (f"; and {more} more" if more > 0 else ""),
            )
        if scanner.lines == 0:
            raise RequestError(400, "the file has no lines; a batch file has one JSON request per line")
        os.replace(partial, final)
    finally:
        partial.unlink(missing_ok=True)
    return File(
        id=file_id,
        purpose=purpose,
        filename=filename,
        bytes=size,
        line_count=scanner.lines,
        path=str(final),
        created_at=utcnow(),
    )


def read_lines(path: str) -> Iterator[tuple[int, dict]]:
    """(line number, parsed line) for every non-blank line of a stored batch file."""
    decode = json.JSONDecoder().decode  # json.loads would also sniff each line's encoding
    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, start=1):
            if raw.strip():
                yield number, decode(raw)


def jsonl_line(line: dict[str, Any]) -> bytes:
    """One JSON object as a compact JSONL line."""
    return json.dumps(line, separators=(",", ":")).encode() + b"\n"
