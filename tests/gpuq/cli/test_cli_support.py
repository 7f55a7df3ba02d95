"""How client commands end when the API is not there."""

import socket

from click.testing import CliRunner

from gpuq.cli.main import main


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
