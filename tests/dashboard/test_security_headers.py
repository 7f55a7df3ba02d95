"""The dashboard's pages and files carry a Content-Security-Policy that allows only gpuq's
own files and API and forbids framing. That the pages work under it is tests/dashboard/
test_dashboard.py's to see: Chromium reports every violation as a console error, on which
each of those tests fails."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api.routers.dashboard import STATIC_FILES
from gpuq.settings import Settings

PATHS = ["/dashboard", "/dashboard/jobs/job_1", *(f"/dashboard/static/{name}" for name in STATIC_FILES)]


@pytest.fixture
def client(tmp_path: Path) -> TestClient:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'unused.db'}", data_dir=tmp_path)
    return TestClient(create_app(settings))


def directives(header: str) -> dict[str, str]:
    return dict(part.strip().split(" ", 1) for part in header.split(";"))


@pytest.mark.parametrize(
    "path", ["/dashboard", "/dashboard/jobs/job_1", *(f"/dashboard/static/{n}" for n in STATIC_FILES)]
)
def test_every_dashboard_response_forbids_framing_and_foreign_code(client: TestClient, path: str) -> None:
    response = client.get(path)
    policy = directives(response.headers["content-security-policy"])
    assert policy["frame-ancestors"] == "'none'" and response.headers["x-frame-options"] == "DENY"
    assert policy["default-src"] == "'none'" and policy["script-src"] == "'self'"
    assert policy["connect-src"] == "'self'" and policy["style-src"] == "'self'"
    assert response.headers["x-content-type-options"] == "nosniff"
