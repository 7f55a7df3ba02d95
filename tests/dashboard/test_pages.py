"""The dashboard's shells, without a browser: served without a key, with no data and nothing
from another host, and only the listed static files."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import get_args

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api.routers.dashboard import DASHBOARD_DIR, PAGES, STATIC_FILES
from api.schemas.batches import BatchEndpoint
from gpuq.settings import Settings

PATHS = [
    "",
    "/jobs",
    "/jobs/job_123",
    "/batches",
    "/batches/batch_123",
    "/schedules",
    "/rules",
    "/workers",
    "/models",
    "/gpus",
    "/keys",
]
SCRIPTS = [name for name in STATIC_FILES if name.endswith(".js")]


def _script(name: str) -> str:
    return (DASHBOARD_DIR / "static" / name).read_text(encoding="utf-8")


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
    for name, content_type in STATIC_FILES.items():
        response = client.get(f"/dashboard/static/{name}")
        assert response.status_code == 200, name
        # A module served as anything but JavaScript is refused by the browser.
        assert response.headers["content-type"].split(";")[0] == content_type
        assert content_type == ("text/javascript" if name.endswith(".js") else "text/css")
    refused = [
        "shell.html",
        "nope.js",
        "main.js",  # a listed file's name, but not its path
        "pages/jobs.js",
        "js",
        "js/",
        "js/pages",
        "js/pages/nope.js",
        "JS/main.js",
        "js/main.js/",
        "..%2Frouters%2Fdashboard.py",
        "js%2F..%2Fapp.css",  # encoded, so the client cannot tidy the dots away first
        "js%2Fpages%2F..%2F..%2F..%2Frouters%2Fdashboard.py",
        "%2Fetc%2Fpasswd",
    ]
    for name in refused:
        assert client.get(f"/dashboard/static/{name}").status_code == 404, name


def test_the_list_of_static_files_is_exactly_what_is_in_the_folder() -> None:
    # A module left off the list would 404 when imported and break its page.
    static = DASHBOARD_DIR / "static"
    on_disk = {path.relative_to(static).as_posix() for path in static.rglob("*") if path.is_file()}
    assert on_disk == set(STATIC_FILES)


def test_every_import_names_a_listed_module_and_every_page_has_one() -> None:
    for name in SCRIPTS:
        for target in re.findall(r'\bfrom\s+"([^"]+)"', _script(name)):
            # Imports are relative (no build step resolves bare names), so they resolve as the browser does.
            assert target.startswith(("./", "../")), (name, target)
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
            assert resolved in STATIC_FILES, (name, target)
    entry = _script("js/main.js")
    for page in PAGES:
        assert f'import * as {page} from "./pages/{page}.js";' in entry


def test_the_scripts_write_data_as_text_and_call_no_other_host() -> None:
    for name in SCRIPTS:
        script = _script(name)
        assert "innerHTML" not in script and "insertAdjacentHTML" not in script and "document.write" not in script
        assert "outerHTML" not in script and "eval(" not in script, name
        expected = ["http://www.w3.org/2000/svg"] if name == "js/chart.js" else []  # a namespace, not a fetch
        assert re.findall(r"https?://[^\"' ]+", script) == expected, name


def test_the_pages_are_not_part_of_the_api_schema(client: TestClient) -> None:
    assert not [p for p in client.get("/openapi.json").json()["paths"] if p.startswith("/dashboard")]


def test_the_pages_and_scripts_hold_nothing_a_strict_content_security_policy_refuses() -> None:
    # No inline script, inline style or event-handler attribute, so `script-src 'self'` and
    # `style-src 'self'` hold; the browser tests serve every page under such a policy.
    for template in (DASHBOARD_DIR / "templates").glob("*.html"):
        html = template.read_text(encoding="utf-8")
        assert not re.search(r"<script(?![^>]*\bsrc=)", html), template.name
        assert "<style" not in html and not re.search(r"\sstyle=", html), template.name
        assert not re.search(r"\son[a-z]+=", html), template.name
    for name in SCRIPTS:
        script = _script(name)
        # Widths go through the CSSOM (node.style.width), which CSP allows; a style attribute it refuses.
        assert not re.search(r"""["']?style["']?\s*:""", script), name
        assert 'setAttribute("style"' not in script and "cssText" not in script, name


def test_the_sign_in_hint_names_a_command_that_makes_an_admin_key(database_url: str, client: TestClient) -> None:
    from click.testing import CliRunner

    from gpuq.cli.main import main

    page = client.get("/dashboard").text
    hint = re.search(r'<code id="key-command">([^<]+)</code>', page)
    assert hint is not None and "data/admin.key" in page  # where `gpuq up` saved the first key
    program, *args = hint.group(1).split()
    assert program == "gpuq"
    result = CliRunner(env={"GPUQ_DATABASE_URL": database_url}).invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "(admin for admin)" in result.stderr and result.stdout.startswith("gpuq_")


def test_the_schedule_form_offers_every_endpoint_a_schedule_takes(client: TestClient) -> None:
    """A schedule runs a batch file's endpoint; an endpoint the API takes but the form lacks
    cannot be chosen from the dashboard."""
    page = client.get("/dashboard/schedules").text
    form = page[page.index('<select name="endpoint">') :]
    offered = re.findall(r"<option>([^<]+)</option>", form[: form.index("</select>")])
    assert sorted(offered) == sorted(get_args(BatchEndpoint))
