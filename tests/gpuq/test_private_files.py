"""Files at rest: the data directory, the SQLite database, batch files and secrets are
readable by gpuq's own user only, whatever the umask."""

import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuq.batches.files import files_dir, store_upload
from gpuq.batches.schedules import store_inline_requests
from gpuq.batches.webhooks import load_secret
from gpuq.db import migrate
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.private_files import prepare_sqlite_file
from tests.api.test_batches_api import line


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def permissive_umask() -> Iterator[None]:
    """The common default, under which plain open() and mkdir() make files every local user reads."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def test_a_new_sqlite_database_and_its_directory_are_private(tmp_path):
    data_dir = tmp_path / "data"
    url = f"sqlite:///{data_dir / 'gpuq.db'}"
    migrate.upgrade(url)
    engine = sync_engine(url)
    with sync_sessions(engine)() as session, session.begin():
        session.connection().exec_driver_sql("CREATE TABLE t (x)")  # a write: SQLite makes its -wal and -shm
        assert {mode(p) for p in data_dir.glob("gpuq.db*")} == {0o600}
        assert {p.name for p in data_dir.glob("gpuq.db*")} >= {"gpuq.db", "gpuq.db-wal", "gpuq.db-shm"}
    engine.dispose()
    assert mode(data_dir) == 0o700


def test_an_existing_database_readable_by_others_is_narrowed_when_opened(tmp_path):
    database = tmp_path / "gpuq.db"
    database.write_bytes(b"")
    database.chmod(0o644)
    prepare_sqlite_file(f"sqlite:///{database}")
    assert mode(database) == 0o600


async def one_chunk(data: bytes):
    yield data


async def test_uploads_inline_requests_and_the_webhook_secret_are_private(tmp_path):
    stored = await store_upload(
        one_chunk((line("a") + "\n").encode()), filename="in.jsonl", purpose="batch", directory=files_dir(tmp_path)
    )
    inline = store_inline_requests(
        [{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"model": "m"}}], tmp_path
    )
    load_secret("", tmp_path)
    assert mode(tmp_path / "files") == 0o700
    assert mode(Path(stored.path)) == mode(Path(inline.path)) == mode(tmp_path / "webhook_secret") == 0o600


def test_an_existing_files_directory_open_to_others_is_narrowed(tmp_path):
    (tmp_path / "files").mkdir(mode=0o755)
    assert mode(files_dir(tmp_path)) == 0o700


def test_a_data_directory_open_to_others_is_left_as_it_is_but_reported(tmp_path, caplog):
    from gpuq.private_files import warn_if_open_to_others

    tmp_path.chmod(0o755)
    warn_if_open_to_others(tmp_path)
    assert mode(tmp_path) == 0o755 and "is open to other local users; `chmod 700` it" in caplog.text
    caplog.clear()
    tmp_path.chmod(0o700)
    warn_if_open_to_others(tmp_path)
    assert caplog.text == ""


def test_gpuq_ups_new_data_directory_and_its_private_redis_files_are_private_from_the_first_start(tmp_path):
    from redis import Redis

    from gpuq.local.data_lock import data_dir_lock
    from gpuq.local.redis_server import PrivateRedis

    data_dir = tmp_path / "new" / "data"
    with data_dir_lock(data_dir) as lock_fd:  # the first thing `gpuq up` does
        assert mode(data_dir) == 0o700 and mode(data_dir.parent) == 0o700
        redis = PrivateRedis(data_dir / "redis", inherit_fds=(lock_fd,))
        client = Redis.from_url(redis.start())
        try:
            client.set("stream", "a tenant's streamed text")
            client.execute_command("BGREWRITEAOF")
            while (
                client.info("persistence")["aof_rewrite_in_progress"]
                or client.info("persistence")["aof_rewrite_scheduled"]
            ):
                time.sleep(0.05)
            files = [p for p in (data_dir / "redis").rglob("*") if p.is_file()]
        finally:
            client.close()
            redis.stop()
    assert mode(data_dir / "redis") == 0o700
    assert any("appendonly" in p.name for p in files)
    assert {p.name: mode(p) for p in files} == {p.name: 0o600 for p in files}
    assert {mode(p) for p in (data_dir / "redis").rglob("*") if p.is_dir()} <= {0o700}
