from collections.abc import Iterator
from typing import cast

import pytest
from fastapi.testclient import TestClient
from redis import Redis

from api.main import create_app
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.db.tables import Job
from gpuq.settings import Settings
from tests.network_guard import PUBLIC_ADDRESS, StubResolver


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
def resolver() -> StubResolver:
    """DNS for the API's webhook checks: hooks.example is public; a test may add names or change answers."""
    return StubResolver({"hooks.example": [PUBLIC_ADDRESS]})


@pytest.fixture
def client(settings: Settings, admin_key: str, resolver: StubResolver) -> Iterator[TestClient]:
    """The API in-process, every request sent with an admin key; webhook hosts resolve through ``resolver``."""
    with TestClient(create_app(settings, resolve=resolver), headers=bearer(admin_key)) as c:
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
    return sorted(cast(list[bytes], redis.keys("rq:job:*")))


def queued_ids(redis: Redis, queue: str) -> list[str]:
    return [x.decode() for x in cast(list[bytes], redis.lrange(f"rq:queue:{queue}", 0, -1))]
