"""The `gpuq` command in-process, through click's runner, against the real API served by
uvicorn in a thread (on a copy of the migrated test database and the test's Redis db)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import chdir
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from gpuq import store
from gpuq.cli.demo import serve_api
from gpuq.cli.main import main
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import Role
from gpuq.settings import Settings
from tests.conftest import RedisDbs, Template, redis_db

MODEL = "smollm2-135m"


@dataclass
class Api:
    url: str
    key: str
    data_dir: Path
    database_url: str


@pytest.fixture(scope="module")
def api(
    tmp_path_factory: pytest.TempPathFactory, sqlite_template: Template, redis_server_url: str, redis_dbs: RedisDbs
) -> Iterator[Api]:
    data_dir = tmp_path_factory.mktemp("cli-api")
    (data_dir / "models").mkdir()
    with sqlite_template.copy(data_dir) as database_url, redis_db(redis_server_url, redis_dbs.main) as redis_url:
        engine = sync_engine(database_url)
        with sync_sessions(engine)() as session:
            _key, secret = store.create_api_key(session, name="cli-test", owner="ops", role=Role.ADMIN)
        engine.dispose()
        settings = Settings(
            database_url=database_url, redis_url=redis_url, data_dir=data_dir, models_dir=data_dir / "models"
        )
        with serve_api(settings) as url:
            yield Api(url, secret, data_dir, database_url)


@pytest.fixture(scope="module")
def batch_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli-files") / "embed.jsonl"
    line = '{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"model": "%s", "input": "hi"}}'
    path.write_text(line % MODEL + "\n")
    return path


def run(args: list[str], env: Mapping[str, str | None], cwd: Path) -> Result:
    """`gpuq ARGS` in directory cwd; an env value of None unsets the variable."""
    # catch_exceptions=False: an exception that escaped gpuq's own handling fails the test
    # with its traceback, rather than being tidied away by the runner.
    with chdir(cwd):
        return CliRunner(env=dict(env)).invoke(main, args, catch_exceptions=False, prog_name="gpuq")


def assert_one_line_error(result: Result, says: str, exit_code: int | None = None) -> None:
    lines = result.stderr.splitlines()
    assert result.exit_code != 0, result.output
    assert exit_code is None or result.exit_code == exit_code, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert says in lines[0], lines[0]
    assert "Traceback" not in result.output
