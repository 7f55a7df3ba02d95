"""The admin dashboard in headless Chromium, against real gpuq processes.

One system for the module: the API, and a supervisor running two workers on simulated GPUs
(24 and 80 GiB), seeded through the API with jobs that succeed, fail and are cancelled, a
schedule run once, and its batch. One browser for the module; a fresh tab per test.
Screenshots go to test-artifacts/screenshots/.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, Route, expect, sync_playwright

from gpuq import store
from gpuq.cli.client import GpuqClient
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.testing import GpuqProcesses
from tests.conftest import REDIS_DB, fresh_database, migrate_and_register, redis_db

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m"
CHROMIUM = os.environ.get("GPUQ_TEST_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
PAGES = ["", "/jobs", "/batches", "/schedules", "/rules", "/workers"]
# How long an action or expectation waits; the page polls the API every 5 s.
WAIT_MS = 15_000


@dataclass
class Seeded:
    url: str
    admin_key: str
    submitter_key: str
    client: GpuqClient
    succeeded: list[str]
    failed: str
    cancelled: list[str]
    database_url: str


def _seed(processes: GpuqProcesses, url: str, client: GpuqClient, model_path: str) -> Seeded:
    """Jobs in every final state. A model whose file disappears before any worker loads it
    fails its job; jobs cancelled before any worker runs stay cancelled."""
    link = processes.workdir / "models" / "fragile.gguf"
    link.symlink_to(model_path)
    client.register_model({"name": "fragile", "path": "fragile.gguf"})
    doomed = client.submit({"kind": "generate", "model": "fragile", "prompt": "hi", "max_tokens": 4})
    link.unlink()
    cancelled = [client.cancel(client.submit({"kind": "noop", "model": MODEL})["id"])["id"] for _ in range(2)]
    succeeded = [client.submit({"kind": "noop", "model": MODEL, "priority": "high"})["id"] for _ in range(3)]
    processes.start_supervisor(expected_workers=2)
    for job_id in [doomed["id"], *succeeded]:
        client.wait(job_id, timeout_s=120)
    request = {"custom_id": "e1", "method": "POST", "url": "/v1/embeddings", "body": {"model": MODEL, "input": "hi"}}
    schedule = client.schedules(
        "POST", json={"name": "nightly-embed", "cron": "0 2 * * *", "endpoint": "/v1/embeddings", "requests": [request]}
    )
    run = client.schedules("POST", f"/{schedule['id']}/run")
    [embedding] = client.jobs(batch_id=run["batch_id"])["data"]
    client.wait(embedding["id"], timeout_s=120)  # a worker now holds the model
    submitter = httpx.post(
        f"{url}/v1/keys",
        json={"name": "dashboard-test", "owner": "acme", "role": "submitter"},
        headers={"Authorization": f"Bearer {processes.admin_key}"},
    ).json()["key"]
    return Seeded(
        url, processes.admin_key, submitter, client, succeeded, doomed["id"], cancelled, processes.database_url
    )


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory, redis_server_url: str, model_path: str) -> Iterator[Seeded]:
    workdir = tmp_path_factory.mktemp("dashboard")
    (workdir / "models").mkdir()
    with fresh_database("sqlite", workdir) as database_url, redis_db(redis_server_url, REDIS_DB - 1) as redis_url:
        migrate_and_register(database_url)
        processes = GpuqProcesses(database_url, redis_url, workdir, settings={"GPUQ_SIMULATED_GPUS": "24,80"})
        try:
            _api, url = processes.start_api()
            with processes.client(url) as client:
                yield _seed(processes, url, client, model_path)
        except Exception:
            print(processes.logs())
            raise
        finally:
            processes.stop_all()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: scripts/install.sh installs it (or set GPUQ_TEST_CHROMIUM)")
    expect.set_options(timeout=WAIT_MS)  # expect() has its own default of 5 s, one refresh period
    with sync_playwright() as p:
        # Debian's Chromium, not a browser downloaded by `playwright install`; no sandbox
        # because CI runs as root; /dev/shm is small in containers.
        args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
        browser = p.chromium.launch(executable_path=CHROMIUM, args=args)
        yield browser
        browser.close()


@dataclass
class Tab:
    page: Page
    errors: list[str]


@pytest.fixture
def tab(browser: Browser) -> Iterator[Tab]:
    """A fresh tab (its own sessionStorage) that records console errors and uncaught exceptions."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            errors.append(f"console: {message.text} ({message.location.get('url')})")

    page.on("console", on_console)
    page.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
    yield Tab(page, errors)
    context.close()


def sign_in(page: Page, url: str, key: str, path: str = "") -> None:
    page.goto(f"{url}/dashboard{path}")
    page.fill("#key", key)
    page.click("#sign-in-form button[type=submit]")


def loaded(page: Page) -> None:
    """Waits until the page has drawn its data once (the "updated" stamp appears)."""
    expect(page.locator("#updated")).to_contain_text("updated")


def screenshot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def _workers(system: Seeded) -> list[dict[str, Any]]:
    response = httpx.get(f"{system.url}/v1/workers", headers={"Authorization": f"Bearer {system.admin_key}"})
    response.raise_for_status()
    return response.json()["data"]  # type: ignore[no-any-return]


def job_ids_in_table(page: Page) -> set[str]:
    return set(page.locator("#jobs tbody tr[data-job]").evaluate_all("rows => rows.map(r => r.dataset.job)"))


def test_every_page_loads_with_its_data_and_no_console_errors(system: Seeded, tab: Tab) -> None:
    page = tab.page
    sign_in(page, system.url, system.admin_key)
    loaded(page)
    cards = page.locator("#gpus .card")
    expect(cards).to_have_count(2)
    expect(cards.first).to_contain_text("(simulated)")
    expect(page.locator("#gpus")).to_contain_text("24576 MiB")
    [holder] = [w for w in _workers(system) if MODEL in w["loaded_models"]]
    expect(page.locator(f'#gpus .card[data-uuid="{holder["gpu_uuids"][0]}"] .models')).to_contain_text(MODEL)
    # Every job has finished: each GPU's worker waits, all its slots free.
    expect(cards.locator(".gpu-state").first).to_have_text(re.compile(r"^idle \d+ slots? free$"))
    expect(cards.locator('.gpu-state[data-state="idle"]')).to_have_count(2)
    expect(page.locator("#summary")).to_contain_text("1 failed")
    expect(page.locator("#queues tbody tr[data-priority]")).to_have_count(3)
    expect(page.locator("#throughput svg polyline")).to_have_count(2)
    expect(page.locator("#failures")).to_contain_text(system.failed)
    expect(page.locator("#failure-reasons")).to_contain_text("Model path does not exist")
    screenshot(page, "overview")
    for path in PAGES[1:]:
        page.goto(f"{system.url}/dashboard{path}")  # the key stays in this tab's sessionStorage
        loaded(page)
        screenshot(page, path.strip("/"))
    expect(page.locator("#workers tbody tr[data-worker]")).to_have_count(2)  # the page now on screen
    for worker in _workers(system):
        slots = f"{worker['slots_busy']} of {worker['slots']} slot"
        expect(page.locator(f'#workers tr[data-worker="{worker["name"]}"] .slots')).to_contain_text(slots)

    page.goto(f"{system.url}/dashboard/schedules")
    page.get_by_role("button", name="History").click()
    expect(page.locator("#schedule-runs tbody tr")).to_have_count(1)
    expect(page.locator("#schedule-next li")).to_have_count(5)
    screenshot(page, "schedule-history")

    page.goto(f"{system.url}/dashboard/jobs/{system.failed}")
    expect(page.locator("#job-fields")).to_contain_text("fragile.gguf")  # the error
    expect(page.locator("#job-prompt")).to_have_text("hi")
    screenshot(page, "job-failed")
    page.goto(f"{system.url}/dashboard/jobs/{system.succeeded[0]}")
    expect(page.locator("#job-fields")).to_contain_text("succeeded")
    expect(page.locator("#job-timings")).to_contain_text(" ms")
    assert tab.errors == []


def test_the_job_filter_narrows_the_table_to_exactly_the_matching_jobs(system: Seeded, tab: Tab) -> None:
    page = tab.page
    sign_in(page, system.url, system.admin_key, "/jobs")
    loaded(page)
    everything = job_ids_in_table(page)
    assert {system.failed, *system.cancelled, *system.succeeded} <= everything

    page.select_option("#job-filter select[name=status]", "failed")
    page.click("#job-filter button[type=submit]")
    expect(page.locator("#jobs tbody tr[data-job]")).to_have_count(1)
    assert job_ids_in_table(page) == {system.failed}
    assert "status=failed" in page.url  # the filter is in the address, so it can be shared
    screenshot(page, "jobs-failed")

    page.select_option("#job-filter select[name=status]", "cancelled")
    page.click("#job-filter button[type=submit]")
    expect(page.locator("#jobs tbody tr[data-job]")).to_have_count(2)
    assert job_ids_in_table(page) == set(system.cancelled)

    page.select_option("#job-filter select[name=status]", "")
    page.fill("#job-filter input[name=model]", "fragile")
    page.click("#job-filter button[type=submit]")
    expect(page.locator("#jobs tbody tr[data-job]")).to_have_count(1)
    assert job_ids_in_table(page) == {system.failed}
    assert tab.errors == []


def test_the_job_table_refreshes_live_without_reloading_the_page(system: Seeded, tab: Tab) -> None:
    page = tab.page
    sign_in(page, system.url, system.admin_key, "/jobs")
    loaded(page)
    page.evaluate("window.sameDocument = true")  # gone if the page were reloaded
    job = system.client.submit({"kind": "noop", "model": MODEL})
    expect(page.locator(f'#jobs tr[data-job="{job["id"]}"]')).to_have_count(1)
    assert page.evaluate("window.sameDocument") is True
    assert tab.errors == []


def test_an_affinity_rule_created_edited_and_deleted_in_the_page_is_so_in_the_api(system: Seeded, tab: Tab) -> None:
    page = tab.page
    sign_in(page, system.url, system.admin_key, "/rules")
    loaded(page)
    form = page.locator("#rule-form")
    form.locator("input[name=model_pattern]").fill("smollm2-*")
    form.locator("select[name=kind]").select_option("embed")
    form.locator("select[name=effect]").select_option("deny")
    form.locator("input[name=precedence]").fill("5")
    form.locator("input[name=gpu_indices]").fill("1")
    form.locator("button[type=submit]").click()
    expect(page.locator("#rules tbody tr[data-rule]")).to_have_count(1)

    [rule] = system.client.rules()
    assert (rule["model_pattern"], rule["kind"], rule["effect"], rule["precedence"], rule["gpu_indices"]) == (
        "smollm2-*",
        "embed",
        "deny",
        5,
        [1],
    )
    # The preview in the page applies it: embeddings may run on GPU 0 only.
    page.select_option("#preview-form select[name=model]", MODEL)
    page.select_option("#preview-form select[name=kind]", "embed")
    page.click("#preview-form button[type=submit]")
    expect(page.locator("#preview-summary")).to_contain_text("may run on 1 of 2 GPUs")
    screenshot(page, "rules")

    # Edit it in the same form, then delete it from the table.
    row = page.locator(f'#rules tr[data-rule="{rule["id"]}"]')
    row.get_by_role("button", name="Edit").click()
    expect(form.locator("input[name=gpu_indices]")).to_have_value("1")
    form.locator("input[name=precedence]").fill("7")
    form.locator("button[type=submit]").click()
    expect(row).to_contain_text("7")
    assert [(r["id"], r["precedence"], r["gpu_indices"]) for r in system.client.rules()] == [(rule["id"], 7, [1])]
    row.get_by_role("button", name="Delete").click()
    expect(page.locator("#rules tbody tr[data-rule]")).to_have_count(0)
    assert system.client.rules() == []
    assert tab.errors == []


def test_a_worker_drained_in_the_page_is_drained_in_the_api_and_undrained_again(system: Seeded, tab: Tab) -> None:
    page = tab.page
    sign_in(page, system.url, system.admin_key, "/workers")
    loaded(page)
    name = sorted(w["name"] for w in _workers(system))[0]
    row = page.locator(f'#workers tr[data-worker="{name}"]')
    row.get_by_role("button", name="Drain", exact=True).click()
    expect(row.get_by_role("button", name="Undrain", exact=True)).to_be_visible()
    [worker] = [w for w in _workers(system) if w["name"] == name]
    assert worker["drained_by"] == ["worker"] and worker["state"] in {"draining", "drained"}
    screenshot(page, "workers-drained")
    page.goto(f"{system.url}/dashboard")  # its GPU's card says so
    card = page.locator(f'#gpus .card[data-uuid="{worker["gpu_uuids"][0]}"]')
    expect(card.locator(".gpu-state")).to_have_attribute("data-state", re.compile(r"^(draining|drained)$"))
    expect(card.locator(".gpu-state")).to_contain_text("drain")
    page.goto(f"{system.url}/dashboard/workers")
    row.get_by_role("button", name="Undrain", exact=True).click()
    expect(row.get_by_role("button", name="Drain", exact=True)).to_be_visible()
    assert [w["drained_by"] for w in _workers(system) if w["name"] == name] == [[]]
    assert tab.errors == []


def test_a_gpu_marked_unhealthy_is_shown_so_and_cleared_from_the_page(system: Seeded, tab: Tab) -> None:
    gpus = httpx.get(f"{system.url}/v1/gpus", headers={"Authorization": f"Bearer {system.admin_key}"}).json()["data"]
    uuid = sorted(g["uuid"] for g in gpus)[0]
    engine = sync_engine(system.database_url)
    with sync_sessions(engine)() as session:  # as a worker does after repeated CUDA errors
        store.set_gpu_health(session, uuid, healthy=False, reason="3 CUDA errors in a row")
    engine.dispose()
    page = tab.page
    sign_in(page, system.url, system.admin_key)
    card = page.locator(f'#gpus .card[data-uuid="{uuid}"]')
    expect(card).to_contain_text("unhealthy: 3 CUDA errors in a row")
    card.get_by_role("button", name="Clear").click()
    expect(card).not_to_contain_text("unhealthy")
    [after] = [
        g
        for g in httpx.get(f"{system.url}/v1/gpus", headers={"Authorization": f"Bearer {system.admin_key}"}).json()[
            "data"
        ]
        if g["uuid"] == uuid
    ]
    assert after["healthy"] is True and after["unhealthy_reason"] is None
    assert tab.errors == []


def _answer_changed(route: Route, change: Any) -> None:
    """Lets the API answer, then changes the JSON: states a quick noop job never stays in."""
    response = route.fetch()
    body = response.json()
    change(body)
    route.fulfill(response=response, body=json.dumps(body))


def test_a_busy_gpu_shows_its_busy_slots_and_running_jobs_and_a_shared_job_its_energy_share(
    system: Seeded, tab: Tab
) -> None:
    worker = sorted(_workers(system), key=lambda w: w["name"])[0]
    running = sorted(system.succeeded[:2])

    def busy(body: dict[str, Any]) -> None:
        [mine] = [w for w in body["data"] if w["name"] == worker["name"]]
        mine |= {"state": "busy", "slots": 4, "slots_busy": 2, "running_jobs": running, "current_job": running[0]}

    page = tab.page
    page.route("**/v1/workers", lambda route: _answer_changed(route, busy))
    sign_in(page, system.url, system.admin_key)
    state = page.locator(f'#gpus .card[data-uuid="{worker["gpu_uuids"][0]}"] .gpu-state')
    expect(state).to_have_attribute("data-state", "busy")
    expect(state).to_contain_text("busy with 2 of 4 slots")
    for job_id in running:  # short ids, each a link to its job
        expect(state.locator(f'a[href="/dashboard/jobs/{job_id}"]')).to_have_text(f"…{job_id[-6:]}")
    screenshot(page, "overview-busy-gpu")
    page.goto(f"{system.url}/dashboard/workers")
    row = page.locator(f'#workers tr[data-worker="{worker["name"]}"]')
    expect(row.locator(".slots")).to_have_text("2 of 4 slots busy")
    expect(row.locator(".running a")).to_have_count(2)
    screenshot(page, "workers-busy")

    # On a real GPU shared with three others, a job is charged a quarter of its energy.
    shared = {"energy_j": 12.3, "gpu_seconds": 0.5, "energy_share": 0.25}
    page.route(f"**/v1/jobs/{running[0]}", lambda route: _answer_changed(route, lambda job: job.update(shared)))
    page.goto(f"{system.url}/dashboard/jobs/{running[0]}")
    expect(page.locator("#job-timings")).to_contain_text("12.3 J (shared GPU: 25 % of its energy")
    screenshot(page, "job-shared-energy")
    assert tab.errors == []


def test_a_key_that_is_not_an_admin_key_is_told_so(system: Seeded, tab: Tab) -> None:
    page = tab.page
    sign_in(page, system.url, system.submitter_key)
    expect(page.locator("#message")).to_contain_text("not an admin key")
    expect(page.locator("#page")).to_be_hidden()
    expect(page.locator("#sign-in")).to_be_visible()
    screenshot(page, "not-admin")
    assert tab.errors == []  # the role is read from /v1/keys/me first: no 403s are provoked


def test_sign_out_and_a_key_revoked_while_the_page_is_open_return_to_the_sign_in_form(system: Seeded, tab: Tab) -> None:
    admin = {"Authorization": f"Bearer {system.admin_key}"}
    created = httpx.post(
        f"{system.url}/v1/keys", json={"name": "dashboard-revoked", "owner": "ops", "role": "admin"}, headers=admin
    ).json()
    page = tab.page
    sign_in(page, system.url, created["key"], "/jobs")
    loaded(page)
    page.click("#sign-out")
    expect(page.locator("#message")).to_have_text("Signed out.")
    expect(page.locator("#page")).to_be_hidden()
    assert page.evaluate("sessionStorage.length") == 0

    # Signed in again in the same tab: the page is set up once, and still refreshes.
    page.fill("#key", created["key"])
    page.click("#sign-in-form button[type=submit]")
    expect(page.locator("#page")).to_be_visible()
    job = system.client.submit({"kind": "noop", "model": MODEL})
    expect(page.locator(f'#jobs tr[data-job="{job["id"]}"]')).to_have_count(1)

    httpx.delete(f"{system.url}/v1/keys/{created['id']}", headers=admin).raise_for_status()
    expect(page.locator("#message")).to_contain_text("no longer valid")  # at the next poll
    expect(page.locator("#page")).to_be_hidden()
    expect(page.locator("#sign-in")).to_be_visible()
    assert page.evaluate("sessionStorage.length") == 0
    # Chromium logs the refused call itself ("401 Unauthorized") as a console error; nothing
    # else may be reported.
    assert [e for e in tab.errors if "401" not in e] == []
