"""Every command's typical mistakes end in one line on stderr and a non-zero exit status,
never a traceback. In-process (see conftest.py), against the real API, so the API's own
refusals come back as they would to a user."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.gpuq.cli.conftest import MODEL, Api, assert_one_line_error, run


def _busy_port() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens once it is closed


# (arguments, what the error line says); `{file}` is a batch file, `{missing}` a path that is not there.
API_MISTAKES = [
    (["submit", "no-such-model", "hello"], "HTTP 404"),
    (["submit", MODEL, "hi", "--priority", "urgent"], "HTTP 422"),
    (["submit", MODEL, "hi", "--max-tokens", "99999"], "context"),
    (["jobs", "--model", MODEL, "--limit", "0"], "Invalid value for '--limit'"),
    (["jobs", "--status", "done"], "Invalid value for '--status'"),
    (["models", "register", "x", "../outside.gguf"], "HTTP 4"),
    (["batch", "status", "batch_nope"], "HTTP 404"),
    (["batch", "results", "batch_nope"], "HTTP 404"),
    (["batch", "cancel", "batch_nope"], "HTTP 404"),
    (["batch", "submit", "{missing}"], "does not exist"),
    (["batch", "submit", "{notjson}"], "line 1: not valid JSON"),
    (["rules", "add", "--model", "m", "--gpus", "a,b"], "'a' is not a GPU index"),
    (["rules", "add", "--model", "m", "--gpus", "0-"], "'0-' is not a GPU index"),
    (["rules", "add", "--model", "m", "--gpus", "3-1"], "a range goes up"),
    (["rules", "add", "--gpus", "0"], "Missing option '--model'"),
    (["rules", "delete", "999"], "HTTP 404"),
    (["rules", "delete", "first"], "Invalid value for 'RULE_ID'"),
    (["rules", "preview", "no-such-model"], "HTTP 404"),
    (["schedules", "add", "n", "not a cron", "{file}"], "HTTP 422"),
    (["schedules", "add", "n", "0 2 * * *", "{missing}"], "does not exist"),
    (["schedules", "add", "n", "0 2 * * *", "{file}", "--timezone", "Mars/Olympus"], "HTTP 422"),
    (["schedules", "run", "no-such-schedule"], "no schedule 'no-such-schedule'"),
    (["schedules", "run", "999"], "no schedule '999'"),
    (["schedules", "preview", "nope"], "no schedule"),
    (["schedules", "runs", "nope"], "no schedule"),
    (["schedules", "pause", "nope"], "no schedule"),
    (["schedules", "resume", "nope"], "no schedule"),
    (["schedules", "delete", "nope"], "no schedule"),
    (["admin", "drain", "no-such-worker"], "HTTP 404"),
    (["admin", "undrain", "no-such-worker"], "HTTP 404"),
    (["admin", "unload", MODEL, "--worker", "no-such-worker"], "HTTP 404"),
    (["admin", "retry", "job_nope"], "HTTP 404"),
    (["admin", "requeue", "job_nope"], "HTTP 404"),
    (["admin", "retry-failed", "--since", "yesterday"], "HTTP 422"),
    (["admin", "clear-gpu", "GPU-nope"], "HTTP 404"),
    (["admin", "drain"], "Missing argument 'WORKER'"),
    (["run", "no-such-model", "hello"], "HTTP 404"),
    (["run", MODEL, "hi", "--max-tokens", "99999"], "context"),
    (["run", MODEL, "hi", "--priority", "urgent"], "Invalid value for '--priority'"),
    (["job", "job_nope"], "HTTP 404"),
    (["cancel", "job_nope"], "HTTP 404"),
    (["nosuch"], "No such command 'nosuch'"),
    (["jobs", "--colour"], "No such option '--colour'"),
]


@pytest.mark.parametrize(("args", "says"), API_MISTAKES, ids=[" ".join(a) for a, _ in API_MISTAKES])
def test_a_mistake_is_one_line_and_a_nonzero_exit(
    api: Api, batch_file: Path, tmp_path: Path, args: list[str], says: str
) -> None:
    (tmp_path / "notjson.jsonl").write_text("{not json\n")
    paths = {"{file}": str(batch_file), "{missing}": str(tmp_path / "missing.jsonl"), "{notjson}": "notjson.jsonl"}
    env = {"GPUQ_API_URL": api.url, "GPUQ_API_KEY": api.key, "GPUQ_DATA_DIR": str(api.data_dir)}
    assert_one_line_error(run([paths.get(a, a) for a in args], env, tmp_path), says)


def test_no_key_names_where_the_admin_key_would_be(api: Api, tmp_path: Path) -> None:
    result = run(["--url", api.url, "jobs"], {"GPUQ_API_KEY": None, "GPUQ_DATA_DIR": None}, tmp_path)
    expected = (
        f"no API key: set GPUQ_API_KEY, or run this where `gpuq up` saved its admin key ({tmp_path}/data/admin.key"
    )
    assert_one_line_error(result, expected, 1)


def test_an_api_that_does_not_answer_is_one_line_with_the_address(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    for args in (
        ["jobs", "--url", url],
        ["--url", url, "rules", "list"],
        ["--url", url, "schedules", "run", "x"],
        ["--url", url, "run", MODEL, "hi"],
    ):
        assert_one_line_error(
            run(args, {"GPUQ_API_KEY": "gpuq_unused"}, tmp_path), f"cannot reach the gpuq API at {url}", 2
        )


def test_url_before_the_command_is_used_and_one_after_it_wins(api: Api, tmp_path: Path) -> None:
    env = {"GPUQ_API_KEY": api.key, "GPUQ_API_URL": f"http://127.0.0.1:{_closed_port()}"}
    before = run(["--url", api.url, "rules", "list"], env, tmp_path)
    assert before.exit_code == 0, before.output
    wrong = f"http://127.0.0.1:{_closed_port()}"
    after = run(["--url", wrong, "rules", "list", "--url", api.url], env, tmp_path)
    assert after.exit_code == 0, after.output


def test_keys_outside_the_data_directory_say_where_they_looked_and_create_nothing(tmp_path: Path) -> None:
    for args in (["keys", "list"], ["keys", "create", "--name", "n", "--owner", "o"], ["keys", "revoke", "k"]):
        result = run(args, {"GPUQ_DATA_DIR": None, "GPUQ_DATABASE_URL": None}, tmp_path)
        assert_one_line_error(result, f"no gpuq database at {tmp_path / 'data' / 'gpuq.db'}", 1)
        assert "GPUQ_DATA_DIR" in result.stderr
    assert list(tmp_path.iterdir()) == []  # no stray empty database


def test_keys_on_an_unmigrated_database_say_to_upgrade(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "gpuq.db").touch()
    env = {"GPUQ_DATA_DIR": None, "GPUQ_DATABASE_URL": None}
    assert_one_line_error(run(["keys", "list"], env, tmp_path), "`gpuq db upgrade` creates its tables", 1)


def test_keys_revoke_of_an_unknown_key_and_create_with_a_bad_role_or_a_name_in_use(api: Api, tmp_path: Path) -> None:
    env = {"GPUQ_DATABASE_URL": api.database_url}
    assert_one_line_error(run(["keys", "revoke", "key_nope"], env, tmp_path), "does not exist", 1)
    assert_one_line_error(
        run(["keys", "create", "--name", "n", "--owner", "o", "--role", "root"], env, tmp_path), "'--role'", 2
    )
    assert_one_line_error(run(["keys", "create", "--owner", "o"], env, tmp_path), "Missing option '--name'", 2)
    made = run(["keys", "create", "--name", "twice", "--owner", "o"], env, tmp_path)
    assert made.exit_code == 0, made.stderr
    assert_one_line_error(
        run(["keys", "create", "--name", "twice", "--owner", "o"], env, tmp_path),
        "o already has an active key named 'twice'",
        1,
    )


def test_processes_without_a_redis_url_say_so(tmp_path: Path) -> None:
    for args in (["api"], ["scheduler"], ["supervisor"], ["worker"]):
        result = run(args, {"GPUQ_REDIS_URL": None}, tmp_path)
        assert_one_line_error(result, "GPUQ_REDIS_URL is not set", 1)


def test_bad_settings_and_databases_are_one_line(tmp_path: Path) -> None:
    assert_one_line_error(run(["jobs"], {"GPUQ_API_PORT": "eighty"}, tmp_path), "bad setting: GPUQ_API_PORT", 1)
    assert_one_line_error(
        run(["keys", "list"], {"GPUQ_DATABASE_URL": "mysql://h/db"}, tmp_path), "unsupported database", 1
    )
    result = run(["db", "upgrade", "--revision", "no-such-revision"], {"GPUQ_DATA_DIR": str(tmp_path)}, tmp_path)
    assert_one_line_error(result, "Can't locate revision", 1)


def test_run_batch_with_a_missing_input_is_a_usage_error(tmp_path: Path) -> None:
    assert_one_line_error(run(["run-batch", "-o", "out.jsonl"], {}, tmp_path), "Missing option '-i'", 2)
    result = run(["run-batch", "-i", "nope.jsonl", "-o", "out.jsonl"], {}, tmp_path)
    assert_one_line_error(result, "does not exist", 2)


def test_up_on_a_port_in_use_fails_before_migrating_or_making_a_key(tmp_path: Path) -> None:
    with _busy_port() as taken:
        port = taken.getsockname()[1]
        env = {"GPUQ_DATA_DIR": str(tmp_path / "data"), "GPUQ_REDIS_URL": None, "GPUQ_DATABASE_URL": None}
        result = run(["up", "--port", str(port)], env, tmp_path)
    assert_one_line_error(result, f"port {port} on 127.0.0.1 is in use", 1)
    assert "--port" in result.stderr and "GPUQ_API_PORT" in result.stderr
    assert result.stdout == ""  # no admin key printed
    assert not (tmp_path / "data").exists()  # no database, no key file, no Redis started


def test_a_group_without_a_command_prints_its_help(tmp_path: Path) -> None:
    result = run(["rules"], {}, tmp_path)
    assert "Usage: gpuq rules" in result.output and "Traceback" not in result.output
