"""How client commands end when the API is not there."""

import socket

from click.testing import CliRunner

from gpuq.cli.main import main
from gpuq.cli.support import remember_url


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens once the socket is closed


def test_a_command_against_an_unreachable_api_says_so_in_one_line(tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}"
    runner = CliRunner(env={"GPUQ_API_KEY": "gpuq_unused", "GPUQ_DATA_DIR": str(tmp_path)})
    result = runner.invoke(main, ["jobs", "--url", url])
    assert result.exit_code == 2
    assert f"cannot reach the gpuq API at {url}" in result.output
    assert isinstance(result.exception, SystemExit)  # a clean exit, not an uncaught connection error


def test_help_shows_the_address_a_command_would_call_and_where_it_comes_from(tmp_path):
    runner = CliRunner(env={"GPUQ_API_URL": "http://127.0.0.5:9000", "GPUQ_DATA_DIR": str(tmp_path)})
    shown = runner.invoke(main, ["jobs", "--help"]).output
    assert "http://127.0.0.5:9000, from GPUQ_API_URL" in " ".join(shown.split())
    assert "127.0.0.1:8000" not in shown
    remember_url(tmp_path, "0.0.0.0", 8123)  # as `gpuq up --port 8123` does
    shown = CliRunner(env={"GPUQ_API_URL": None, "GPUQ_DATA_DIR": str(tmp_path)}).invoke(main, ["jobs", "--help"])
    assert "http://127.0.0.1:8123, saved by `gpuq up`" in " ".join(shown.output.split())


def test_a_command_without_url_calls_the_address_gpuq_up_saved(tmp_path):
    port = _closed_port()
    remember_url(tmp_path, "127.0.0.1", port)
    runner = CliRunner(env={"GPUQ_API_URL": None, "GPUQ_API_KEY": "gpuq_unused", "GPUQ_DATA_DIR": str(tmp_path)})
    result = runner.invoke(main, ["jobs"])
    assert f"cannot reach the gpuq API at http://127.0.0.1:{port}" in result.output
    # GPUQ_API_URL, then --url, win over it.
    from_env, given = f"http://127.0.0.1:{_closed_port()}", f"http://127.0.0.1:{_closed_port()}"
    assert (
        f"cannot reach the gpuq API at {from_env}"
        in runner.invoke(main, ["jobs"], env={"GPUQ_API_URL": from_env}).output
    )
    assert f"cannot reach the gpuq API at {given}" in runner.invoke(main, ["--url", given, "jobs"]).output
