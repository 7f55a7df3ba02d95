"""The body of ``POST /v1/messages/batches``, read as it arrives rather than whole.

A Message Batch carries its requests inline: 10,000 requests of 4 KB are a 40 MB body.
Parsed the usual way (FastAPI reads the whole body, parses it, builds a model of every
request, and the route copied each back to a dict) the body was held three times over at
once, and the API's memory stayed 1.36x its baseline once the batch was accepted
(docs/benchmarks.md). So it is read the way an upload is (gpuq/batches/files.py):

1. :func:`spool` streams the body to a file in the files folder, a chunk at a time;
2. :func:`outline` reads that file once with ijson's C parser, building no request: the
   small top-level fields (``priority``, ``webhook_url``), how many requests there are, and
   whether the body is JSON gpuq can take (valid, at most ``MAX_DEPTH`` deep, no lone
   surrogate);
3. :func:`requests` parses the requests one at a time for
   gpuq/batches/message_batches.py, which checks each, writes it as a batch line and drops it.

The spool file is named as an unfinished upload (``.file-*.part``), so one left by an API
killed mid-request is removed at its next start (``remove_stale_uploads``); the route
removes it once the batch is created or refused.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ijson

from gpuq.batches.files import DISK_FULL, new_file_id
from gpuq.batches.message_batches import MAX_REQUESTS
from gpuq.errors import RequestError
from gpuq.json_checks import MAX_DEPTH, depth_message, surrogate_message
from gpuq.private_files import open_private

REQUESTS = "requests"
_OPENED = ("start_map", "start_array")
_CLOSED = ("end_map", "end_array")
_SHAPE = 'the request body is a JSON object: {"requests": [{"custom_id": ..., "params": {...}}, ...]}'


@dataclass(frozen=True)
class Outline:
    """What the body holds, but its requests: its other top-level fields (an object or
    array among them given as an empty one: enough to be refused by type) and how many
    requests it has."""

    fields: dict[str, Any]
    requests: int


async def spool(chunks: AsyncIterator[bytes], directory: Path) -> Path:
    """The body written to a private file in ``directory``, a chunk at a time; a full disk
    is a 507 saying so, with nothing left."""
    path = directory / f".{new_file_id()}.part"
    try:
        with open_private(path, exclusive=True) as out:
            async for chunk in chunks:
                out.write(chunk)
    except BaseException as exc:
        path.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in DISK_FULL:
            raise RequestError(
                507, "the server's disk is full: the batch was not stored; try again later, or ask its operator"
            ) from None
        raise
    return path


def outline(path: Path) -> Outline:
    """The body's :class:`Outline`; a 400 if it is not JSON, not an object with one
    ``requests`` list, nested deeper than ``MAX_DEPTH``, or holds a lone surrogate."""
    reader = _OutlineReader()
    with path.open("rb") as body:
        try:
            for _, event, value in ijson.parse(body, use_float=True):
                reader.read(event, value)
        except ijson.JSONError as exc:
            reason = str(exc).split("\n", 1)[0]
            raise RequestError(400, f"the request body is not valid JSON ({reason})", code="invalid_json") from None
        except UnicodeDecodeError:  # how ijson's parser meets a lone \\uXXXX surrogate, which is not text
            raise RequestError(400, surrogate_message("the request body"), code="invalid_value") from None
    count = reader.count
    if count is None:
        raise RequestError(400, "requests: Field required", param=REQUESTS)
    if not 1 <= count <= MAX_REQUESTS:
        raise RequestError(400, f"requests: give 1 to {MAX_REQUESTS} requests (there are {count})", param=REQUESTS)
    return Outline(reader.fields, count)


@dataclass
class _OutlineReader:
    """Follows ijson's events (``start_map``, ``map_key``, a scalar's type, ``end_array``...)
    through the body, keeping only what an :class:`Outline` holds."""

    fields: dict[str, Any] = field(default_factory=dict)
    count: int | None = None  # None until the requests list begins
    level: int = 0  # how many objects and lists hold the next event (0: it is the body itself)
    key: str | None = None  # the top-level field whose value comes next
    in_requests: bool = False

    def read(self, event: str, value: Any) -> None:
        if event in _CLOSED:
            self.level -= 1
            self.in_requests = self.in_requests and self.level > 1
            return
        if self.level == 0 and event != "start_map":
            raise RequestError(400, _SHAPE, code="invalid_value")
        if self.level == 1 and event == "map_key":
            self.key = value
        elif self.level == 1:
            self._field_begins(event, value)
        elif self.level == 2 and self.in_requests and self.count is not None:
            self.count += 1  # a request begins
        if event in _OPENED:
            self.level += 1
            if self.level > MAX_DEPTH:  # refused before ijson's prefixes, a word a level, grow long
                raise RequestError(400, depth_message("the request body"), code="invalid_value")

    def _field_begins(self, event: str, value: Any) -> None:
        if self.key != REQUESTS:
            opened: dict[str, Any] = {"start_map": {}, "start_array": []}
            self.fields[str(self.key)] = opened.get(event, value)
        elif self.count is not None:
            raise RequestError(400, "requests: give it once", param=REQUESTS)
        elif event != "start_array":
            raise RequestError(400, "requests: Input should be a valid list", param=REQUESTS)
        else:
            self.count, self.in_requests = 0, True


def requests(path: Path) -> Iterator[Any]:
    """The body's requests, parsed one at a time (the body has passed :func:`outline`)."""
    with path.open("rb") as body:
        yield from ijson.items(body, "requests.item", use_float=True)
