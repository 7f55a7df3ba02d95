"""How `gpuq up` serves the API: its access log keeps writes and errors but not the reads that
succeeded (the dashboard polls several of them every 5 s), unless every request is asked for."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gpuq.cli.serving import listen, server


async def _ok(_request: object) -> PlainTextResponse:
    return PlainTextResponse("ok")


APP = Starlette(routes=[Route("/v1/jobs", _ok, methods=["GET", "POST"])])


@contextmanager
def serving(*, quiet_reads: bool) -> Iterator[str]:
    sock = listen("127.0.0.1", 0)
    api = server(APP, sock, quiet_reads=quiet_reads)
    thread = threading.Thread(target=api.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not api.started and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        api.should_exit = True
        thread.join(timeout=10)
        sock.close()


def _requests(url: str) -> None:
    with httpx.Client(base_url=url) as client:
        for _ in range(3):  # a dashboard tab's polling
            assert client.get("/v1/jobs").status_code == 200
        assert client.post("/v1/jobs").status_code == 200
        assert client.get("/v1/nothing-here").status_code == 404
    time.sleep(0.2)  # the access log is written after the response


def test_the_access_log_of_gpuq_up_leaves_out_successful_reads(capsys: pytest.CaptureFixture[str]) -> None:
    with serving(quiet_reads=True) as url:
        _requests(url)
    log = capsys.readouterr().out
    assert '"POST /v1/jobs HTTP/1.1" 200' in log
    assert '"GET /v1/nothing-here HTTP/1.1" 404' in log
    assert '"GET /v1/jobs HTTP/1.1"' not in log


def test_with_every_request_asked_for_the_reads_are_logged_too(capsys: pytest.CaptureFixture[str]) -> None:
    with serving(quiet_reads=False) as url:
        _requests(url)
    log = capsys.readouterr().out
    assert log.count('"GET /v1/jobs HTTP/1.1" 200') == 3 and '"POST /v1/jobs HTTP/1.1" 200' in log
