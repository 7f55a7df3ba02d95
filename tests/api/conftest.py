from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from redis import Redis

from api.main import create_app
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import Job
from gpuq.settings import Settings


@pytest.fixture
def settings(database_url: str, redis_url: str, tmp_path) -> Settings:
    (tmp_path / "models").mkdir()
    return Settings(
        database_url=database_url,
        redis_url=redis_url,
        data_dir=tmp_path,
        models_dir=tmp_path / "models",
        max_body_bytes=64 * 1024,
    )


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def client(settings: Settings, admin_key: str) -> Iterator[TestClient]:
    """The API in-process, every request sent with an admin key."""
    with TestClient(create_app(settings), headers=bearer(admin_key)) as c:
        yield c


@pytest.fixture
def job_rows(database_url: str):
    """Reads the jobs table as it is now."""
    engine = sync_engine(database_url)
    sessions = sync_sessions(engine)

    def read() -> list[Job]:
        with sessions() as s:
            return list(s.query(Job).order_by(Job.created_at))

    yield read
    engine.dispose()


def redis_job_keys(redis: Redis) -> list[bytes]:
    return sorted(redis.keys("rq:job:*"))


def queued_ids(redis: Redis, queue: str) -> list[str]:
    return [x.decode() for x in redis.lrange(f"rq:queue:{queue}", 0, -1)]
