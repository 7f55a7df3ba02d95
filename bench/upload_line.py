"""One long line in an upload: the scanner's cost per megabyte should not grow with the line.

An upload arrives in 1 MiB chunks (api/routers/files.py); a line longer than a chunk is
put together from them. The baseline is the irreducible work on the same line: parsing
it once with ``json.loads``. A scanner that copied the line at every chunk would cost
per MB in proportion to the line's length (16 MB in 0.7 s, 96 MB in 16 s before the fix).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from gpuq.batches.files import LineScanner

CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class LineCost:
    megabytes: int
    scan_s: float
    parse_s: float

    @property
    def scan_s_per_mb(self) -> float:
        return self.scan_s / self.megabytes


def long_line(megabytes: int) -> bytes:
    text = "x" * (megabytes << 20)
    body = {"model": "smollm2-135m", "input": text}
    return json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": body}).encode() + b"\n"


def measure(megabytes: int) -> LineCost:
    data = long_line(megabytes)
    start = time.perf_counter()
    scanner = LineScanner()
    for offset in range(0, len(data), CHUNK_BYTES):
        scanner.feed(data[offset : offset + CHUNK_BYTES])
    scanner.finish()
    scan_s = time.perf_counter() - start
    assert scanner.lines == 1 and not scanner.errors, scanner.errors
    start = time.perf_counter()
    json.loads(data)
    return LineCost(megabytes, scan_s, time.perf_counter() - start)
