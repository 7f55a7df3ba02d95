"""Deadlines on the dashboard's jobs list and job page, in headless Chromium, against a real
gpuq API process with no worker (so that jobs stay queued, one of them past its deadline).
The browser, the tabs (strict CSP, console errors recorded) and the layout checks at 1280
and 800 px are those of test_dashboard.py and test_admin_pages.py."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from playwright.sync_api import expect

from gpuq.cli.client import GpuqClient
from gpuq.testing import GpuqProcesses
from tests.conftest import RedisDbs, fresh_database, migrate_and_register, redis_db
from tests.dashboard import test_dashboard as shared
from tests.dashboard.test_admin_pages import assert_fits_both_widths
from tests.dashboard.test_dashboard import MODEL, Tab, loaded, sign_in

browser = shared.browser
tab = shared.tab

pytestmark = pytest.mark.e2e


def when(iso: str) -> str:
    """A time as the pages write it (js/dom.js's when): "2026-12-07 14:30:00Z"."""
    moment = datetime.fromisoformat(iso)
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


@dataclass
class Queued:
    url: str
    admin_key: str
    client: GpuqClient
    late: dict  # queued, its deadline passed
    due: dict  # queued, its deadline an hour ahead
    plain: dict  # queued, no deadline


@pytest.fixture(scope="module")
def queued(tmp_path_factory: pytest.TempPathFactory, redis_server_url: str, redis_dbs: RedisDbs) -> Iterator[Queued]:
    workdir = tmp_path_factory.mktemp("dashboard-deadlines")
    (workdir / "models").mkdir()
    with fresh_database("sqlite", workdir) as database_url, redis_db(redis_server_url, redis_dbs.spare) as redis_url:
        migrate_and_register(database_url)
        processes = GpuqProcesses(database_url, redis_url, workdir)
        try:
            _api, url = processes.start_api()
            with processes.client(url) as client:
                soon = datetime.now(UTC) + timedelta(seconds=2)
                late = client.submit({"kind": "noop", "model": MODEL, "deadline": soon.isoformat()})
                due = client.submit(
                    {"kind": "noop", "model": MODEL, "deadline": (datetime.now(UTC) + timedelta(hours=1)).isoformat()}
                )
                plain = client.submit({"kind": "noop", "model": MODEL})
                while datetime.now(UTC) <= soon:  # no worker: it stays queued past its deadline
                    time.sleep(0.2)
                yield Queued(url, processes.admin_key, client, late, due, plain)
        except Exception:
            print(processes.logs())
            raise
        finally:
            processes.stop_all()


def test_the_jobs_list_marks_each_deadline_and_a_late_one_and_fits_800_px(queued: Queued, tab: Tab) -> None:
    page = tab.page
    sign_in(page, queued.url, queued.admin_key, "/jobs")
    loaded(page)
    row = lambda job: page.locator(f'#jobs tbody tr[data-job="{job["id"]}"] .deadline')  # noqa: E731
    expect(row(queued.late)).to_have_text(re.compile(r"^late \d+(\.\d)? (s|min)$"))
    expect(row(queued.late)).to_have_class("small sub-line deadline late")
    expect(row(queued.late)).to_have_attribute("title", f"deadline {when(queued.late['deadline'])}")
    expect(row(queued.due)).to_have_text(re.compile(r"^due in \d+ min$"))
    expect(row(queued.plain)).to_have_count(0)
    assert_fits_both_widths(page, "jobs-deadlines")
    assert tab.errors == []


def test_a_jobs_page_shows_its_deadline_and_says_when_it_is_queued_past_it(queued: Queued, tab: Tab) -> None:
    page = tab.page
    sign_in(page, queued.url, queued.admin_key, f"/jobs/{queued.late['id']}")
    loaded(page)
    timings = page.locator("#job-timings")
    expect(timings).to_contain_text(f"deadline{when(queued.late['deadline'])} queued past its deadline")
    assert_fits_both_widths(page, "job-late")

    page.goto(f"{queued.url}/dashboard/jobs/{queued.due['id']}")
    loaded(page)
    expect(timings).to_contain_text(f"deadline{when(queued.due['deadline'])}")
    expect(timings.locator(".late")).to_have_count(0)
    page.goto(f"{queued.url}/dashboard/jobs/{queued.plain['id']}")
    loaded(page)
    expect(timings).to_contain_text("created")
    expect(timings).not_to_contain_text("deadline")
    assert tab.errors == []
