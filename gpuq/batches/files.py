"""Batch files on disk, described in SQL (OpenAI's ``/v1/files``).

An upload is streamed to disk a chunk at a time and checked line by line as it goes (JSON,
a unique ``custom_id``, ``POST`` to a known endpoint, a body naming a model), so a 200 MB
file is never held in memory. A file with bad lines is refused whole, with the line
numbers, and nothing is kept. Files are readable by gpuq's user only (gpuq/private_files.py).
Deleting a file removes its row, then its bytes.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from gpuq import store
from gpuq.batches.openai_format import ENDPOINTS
from gpuq.db.tables import File, utcnow
from gpuq.errors import RequestError
from gpuq.json_checks import NUL, NUL_ESCAPE, depth_message, may_be_too_deep, nul_location, nul_message, too_deep
from gpuq.private_files import DIR_MODE, open_private, open_to_others, private_dir

log = logging.getLogger(__name__)

PURPOSE_BATCH = "batch"
STALE_UPLOAD_S = 600.0
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
PURPOSE_OUTPUT = "batch_output"
MAX_ERRORS_REPORTED = 20
MAX_LINES = 50_000


def new_file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


def remove_stale_uploads(directory: Path, *, untouched_s: float = STALE_UPLOAD_S) -> list[Path]:
    """Removes the ``.part`` files of uploads nobody is writing any more (an API killed while
    it stored one leaves its file, with no row); returns them. An upload in progress writes
    every chunk, so one untouched for ``untouched_s`` has no writer left."""
    cutoff = time.time() - untouched_s
    removed = []
    for partial in directory.glob(".file-*.part"):
        with contextlib.suppress(FileNotFoundError):
            if partial.stat().st_mtime < cutoff:
                partial.unlink()
                removed.append(partial)
    if removed:
        log.warning("removed %d upload(s) left unfinished by a stopped API: %s", len(removed), removed)
    return removed


def files_dir(data_dir: Path) -> Path:
    """``<data_dir>/files``, readable by gpuq's user only (it holds every tenant's batches)."""
    path = private_dir(data_dir / "files")
    if open_to_others(path):
        os.chmod(path, DIR_MODE)
    return path


def _unstorable(raw: bytes, line: Any) -> str | None:
    """Why a parsed line could not be stored or run whatever its fields say, or None."""
    if may_be_too_deep(raw) and too_deep(line):
        return depth_message("the line")
    if NUL_ESCAPE in raw:
        where = nul_location(line)
        if where is not None:
            return nul_message(f"`{where}`")
    return None


def check_line(raw: bytes, seen: set[str]) -> str | None:
    """Why a batch line is malformed, or None. Records its custom_id in ``seen``."""
    try:
        line = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return f"not valid JSON ({exc.msg if isinstance(exc, json.JSONDecodeError) else 'bad UTF-8'})"
    except RecursionError:  # thousands of brackets: too deep for the parser itself
        return depth_message("the line")
    if not isinstance(line, dict):
        return "each line must be a JSON object"
    problem = _unstorable(raw, line)
    if problem is not None:
        return problem
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
    """Checks lines as chunks arrive; keeps only the custom_ids, not the lines.

    A line longer than a chunk is kept as its pieces and joined once, when its end
    arrives: joining at every chunk would copy it again each time, a cost that grows with
    the square of the line (a 96 MB line took 16 s so)."""

    seen: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    lines: int = 0
    number: int = 0
    _pieces: list[bytes] = field(default_factory=list)  # the line begun but not yet ended

    def feed(self, chunk: bytes) -> None:
        if b"\n" not in chunk:
            self._pieces.append(chunk)
            return
        first, *complete, rest = chunk.split(b"\n")
        self._check(b"".join([*self._pieces, first]))
        for raw in complete:
            self._check(raw)
        self._pieces = [rest] if rest else []

    def finish(self) -> None:
        partial = b"".join(self._pieces)
        if partial.strip():
            self._check(partial)
        self._pieces = []

    def _check(self, raw: bytes) -> None:
        self.number += 1
        if not raw.strip():
            return
        self.lines += 1
        problem = check_line(raw, self.seen)
        if problem is not None:
            self.errors.append(f"line {self.number}: {problem}")


def check_filename(filename: str) -> str:
    """The name to keep for an upload; NUL characters cannot be stored (see gpuq/json_checks.py)."""
    if NUL in filename:
        raise RequestError(422, nul_message("the file name"), param="file")
    return filename


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
    """Stream an upload to disk, checking it; returns the (unsaved) File row. Every refusal
    is a 422 (what a bad value is everywhere in gpuq), with nothing left on disk; a full
    disk is a 507 saying so, with nothing left either."""
    if purpose != PURPOSE_BATCH:
        raise RequestError(
            422, f"purpose {purpose!r} is not supported; gpuq stores files with purpose 'batch'", param="purpose"
        )
    filename = check_filename(filename)
    file_id = new_file_id()
    final = directory / f"{file_id}.jsonl"
    partial = directory / f".{file_id}.part"
    scanner = LineScanner()
    size = 0
    try:
        with open_private(partial, exclusive=True) as out:
            async for chunk in chunks:
                scanner.feed(chunk)
                out.write(chunk)
                size += len(chunk)
                if scanner.lines > MAX_LINES:
                    raise RequestError(422, f"the file has more than {MAX_LINES} lines; split it into several batches")
        scanner.finish()
        if scanner.errors:
            shown = "; ".join(scanner.errors[:MAX_ERRORS_REPORTED])
            more = len(scanner.errors) - MAX_ERRORS_REPORTED
            raise RequestError(
                422,
                f"invalid batch file, {len(scanner.errors)} bad lines: {shown}"
                + (f"; and {more} more" if more > 0 else ""),
            )
        if scanner.lines == 0:
            raise RequestError(422, "the file has no lines; a batch file has one JSON request per line")
        os.replace(partial, final)
    except OSError as exc:
        if exc.errno not in DISK_FULL:
            raise
        raise RequestError(
            507, "the server's disk is full: the file was not stored; try again later, or ask its operator"
        ) from None
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


def save_upload(session: Session, file: File) -> File:
    """The row of a stored upload. If it cannot be written, the file is removed too: no
    file is left on disk without a row."""
    try:
        return store.save_file(session, file)
    except BaseException:
        Path(file.path).unlink(missing_ok=True)
        raise


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
