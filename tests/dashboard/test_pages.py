"""The dashboard's shells, without a browser: served without a key, with no data and nothing
from another host, and only the listed static files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api.routers.dashboard import DASHBOARD_DIR, PAGES, STATIC_FILES
from gpuq.settings import Settings

PATHS = ["", "/jobs", "/jobs/job_123", "/batches", "/schedules", "/rules", "/workers"]


@pytest.fixture
def client(tmp_path: Path) -> TestClient:
    # No lifespan (no `with`): the dashboard's routes touch neither the database nor Redis.
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'unused.db'}", data_dir=tmp_path)
    return TestClient(create_app(settings))


@pytest.mark.parametrize("path", PATHS)
def test_each_page_is_served_without_a_key_and_loads_only_gpuq_files(client: TestClient, path: str) -> None:
    response = client.get(f"/dashboard{path}")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    page = re.search(r'data-page="(\w+)"', response.text)
    assert page is not None and page.group(1) in PAGES
    assert "{{" not in response.text
    for url in re.findall(r'(?:src|href)="([^"]*)"', response.text):
        assert url.startswith("/dashboard") or url == "data:,", url


def test_the_job_id_in_the_address_is_not_written_into_the_page(client: TestClient) -> None:
    response = client.get("/dashboard/jobs/%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E")
    assert response.status_code == 200 and "onerror" not in response.text


def test_only_the_listed_static_files_are_served(client: TestClient) -> None:
    for name in STATIC_FILES:
        assert client.get(f"/dashboard/static/{name}").status_code == 200
    for name in ["shell.html", "..%2Frouters%2Fdashboard.py", "nope.js"]:
        assert client.get(f"/dashboard/static/{name}").status_code == 404


def test_the_script_writes_data_as_text_and_calls_no_other_host() -> None:
    script = (DASHBOARD_DIR / "static" / "app.js").read_text()
    assert "innerHTML" not in script and "insertAdjacentHTML" not in script and "document.write" not in script
    assert re.findall(r"https?://[^\"' ]+", script) == ["http://www.w3.org/2000/svg"]  # a namespace, not a fetch


def test_the_pages_are_not_part_of_the_api_schema(client: TestClient) -> None:
    assert not [p for p in client.get("/openapi.json").json()["paths"] if p.startswith("/dashboard")]
