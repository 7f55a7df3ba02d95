"""Batch file lines checked as an upload streams in, whatever the chunks' boundaries."""

import json
from pathlib import Path

import pytest

from gpuq.batches.files import LineScanner
from gpuq.db.tables import File


def good(custom_id: str, text: str = "hi") -> bytes:
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}).encode()


def scan(data: bytes, chunk: int) -> LineScanner:
    scanner = LineScanner()
    for start in range(0, len(data), chunk):
        scanner.feed(data[start : start + chunk])
    scanner.finish()
    return scanner


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 20])
def test_lines_are_numbered_and_checked_the_same_whatever_the_chunk_size(chunk):
    data = b"\n".join([good("a"), b"", good("b", "x" * 5000), b"[1]", good("a")]) + b"\n\n" + good("c")
    scanner = scan(data, chunk)
    assert (scanner.lines, scanner.number) == (5, 7)
    assert scanner.errors == [
        "line 4: each line must be a JSON object",
        "line 5: custom_id 'a' is used twice; each must be unique",
    ]
    assert scanner.seen == {"a", "b", "c"}


def test_a_line_longer_than_many_chunks_is_checked_whole():
    long_line = good("big", "y" * 3_000_000)
    scanner = scan(long_line + b"\n" + good("next"), chunk=1 << 16)
    assert (scanner.lines, scanner.errors, scanner.seen) == (2, [], {"big", "next"})


async def test_an_upload_whose_row_cannot_be_written_leaves_no_file(session, tmp_path):
    from sqlalchemy.exc import IntegrityError

    from gpuq import store
    from gpuq.batches import files

    async def body():
        yield good("a") + b"\n"

    stored = await files.store_upload(body(), filename="in.jsonl", purpose="batch", directory=files.files_dir(tmp_path))
    assert Path(stored.path).exists()
    # The database refuses the row for real: another file already has its id.
    store.save_file(
        session,
        File(
            **{c: getattr(stored, c) for c in ("id", "purpose", "filename", "bytes", "line_count", "created_at")},
            path="/elsewhere",
        ),
    )
    session.expunge_all()
    with pytest.raises(IntegrityError):
        files.save_upload(session, stored)
    assert not Path(stored.path).exists() and list((tmp_path / "files").iterdir()) == []
