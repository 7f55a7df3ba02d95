"""The admin dashboard in headless Chromium, against real gpuq processes.

One system for the module: the API, the scheduler, and a supervisor running two workers on
simulated GPUs (24 and 80 GiB, sampled every second), seeded through the API with jobs that
succeed, fail and are cancelled (more than a page of them), a batch with a failed line, and
a schedule in Europe/Paris run once. One browser for the module; a fresh tab per test, 1280
px wide, served under a strict Content-Security-Policy (no inline script or style), whose
violations would be console errors. Every page is checked for console errors, horizontal
overflow and ids or names broken across lines. Screenshots go to test-artifacts/screenshots/.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from playwright.sync_api import Browser, ConsoleMessage, Page, Route, ViewportSize, expect, sync_playwright

from gpuq import store
from gpuq.cli.client import GpuqClient
from gpuq.cli.main import main
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.testing import GpuqProcesses
from tests.conftest import RedisDbs, fresh_database, migrate_and_register, redis_db

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m"
CHROMIUM = os.environ.get("GPUQ_TEST_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
PAGES = ["", "/jobs", "/batches", "/schedules", "/rules", "/workers"]
# How long an action or expectation waits; the page polls the API every 5 s.
WAIT_MS = 15_000


# What issue 13's header may be at its strictest: scripts and styles from gpuq's own files only.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)
VIEWPORT: ViewportSize = {"width": 1280, "height": 900}
NOOPS = 60  # with the others, more than one page (50) of jobs


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
    batch_id: str  # two lines answered, one failed
    workdir: Path


def _seed(processes: GpuqProcesses, url: str, client: GpuqClient, model_path: str) -> Seeded:
    """Jobs in every final state. A model whose file disappears before any worker loads it
    fails its job (and its batch line); jobs cancelled before any worker runs stay cancelled.
    The filler comes first, so that the newest page holds the jobs the tests look for."""
    filler = client.submit_many([{"kind": "noop", "model": MODEL, "priority": "low"} for _ in range(NOOPS)])
    link = processes.workdir / "models" / "fragile.gguf"
    link.symlink_to(model_path)
    client.register_model({"name": "fragile", "path": "fragile.gguf"})
    doomed = client.submit({"kind": "generate", "model": "fragile", "prompt": "hi", "max_tokens": 4})
    lines = [
        {"custom_id": "e1", "method": "POST", "url": "/v1/embeddings", "body": {"model": MODEL, "input": "one"}},
        {"custom_id": "e2", "method": "POST", "url": "/v1/embeddings", "body": {"model": MODEL, "input": "two"}},
        {"custom_id": "f1", "method": "POST", "url": "/v1/completions", "body": {"model": "fragile", "prompt": "x"}},
    ]
    batch_input = processes.workdir / "batch.jsonl"
    batch_input.write_text("".join(json.dumps(line) + "\n" for line in lines))
    batch = client.create_batch(client.upload(str(batch_input))["id"], endpoint="/v1/embeddings")
    link.unlink()
    cancelled = [client.cancel(client.submit({"kind": "noop", "model": MODEL})["id"])["id"] for _ in range(2)]
    succeeded = [client.submit({"kind": "noop", "model": MODEL, "priority": "high"})["id"] for _ in range(3)]
    processes.start_scheduler()  # finalises batches
    processes.start_supervisor(expected_workers=2)
    for job_id in [doomed["id"], *succeeded, filler[-1]["id"]]:
        client.wait(job_id, timeout_s=120)
    request = {"custom_id": "e1", "method": "POST", "url": "/v1/embeddings", "body": {"model": MODEL, "input": "hi"}}
    schedule = client.schedules(
        "POST",
        json={
            "name": "nightly-embed",
            "cron": "0 2 * * *",
            "timezone": "Europe/Paris",
            "endpoint": "/v1/embeddings",
            "requests": [request],
        },
    )
    run = client.schedules("POST", f"/{schedule['id']}/run")
    [embedding] = client.jobs(batch_id=run["batch_id"])["data"]
    client.wait(embedding["id"], timeout_s=120)  # a worker now holds the model
    deadline = time.monotonic() + 60
    while client.batch(batch["id"])["status"] != "completed":
        assert time.monotonic() < deadline, f"batch {batch['id']} did not complete"
        time.sleep(0.2)
    submitter = httpx.post(
        f"{url}/v1/keys",
        json={"name": "dashboard-test", "owner": "acme", "role": "submitter"},
        headers={"Authorization": f"Bearer {processes.admin_key}"},
    ).json()["key"]
    return Seeded(
        url,
        processes.admin_key,
        submitter,
        client,
        succeeded,
        doomed["id"],
        cancelled,
        processes.database_url,
        batch["id"],
        processes.workdir,
    )


@pytest.fixture(scope="module")
def system(
    tmp_path_factory: pytest.TempPathFactory, redis_server_url: str, redis_dbs: RedisDbs, model_path: str
) -> Iterator[Seeded]:
    workdir = tmp_path_factory.mktemp("dashboard")
    (workdir / "models").mkdir()
    with fresh_database("sqlite", workdir) as database_url, redis_db(redis_server_url, redis_dbs.spare) as redis_url:
        migrate_and_register(database_url)
        settings = {"GPUQ_SIMULATED_GPUS": "24,80", "GPUQ_GPU_SAMPLE_INTERVAL_S": "1"}
        processes = GpuqProcesses(database_url, redis_url, workdir, settings=settings)
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


def _with_csp(route: Route) -> None:
    """Serves the dashboard's pages under CSP; scripts, styles and API calls pass untouched."""
    if route.request.resource_type != "document":
        route.fallback()
        return
    response = route.fetch()
    route.fulfill(response=response, headers={**response.headers, "content-security-policy": CSP})


@pytest.fixture
def tab(browser: Browser) -> Iterator[Tab]:
    """A fresh tab (its own sessionStorage) that records console errors and uncaught exceptions,
    CSP violations among them."""
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    page.route("**/dashboard**", _with_csp)
    errors: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            errors.append(f"console: {message.text} ({message.location.get('url')})")

    page.on("console", on_console)
    page.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
    yield Tab(page, errors)
    context.close()


# Elements wider than the window, and text of cells meant to hold one line (ids, names,
# numbers, times: every cell but the free-text ones) or of ids anywhere that got broken
# across lines ("generat|e", "smollm2-|135m").
LAYOUT_PROBLEMS = """() => {
  const width = document.documentElement.clientWidth;
  const overflowing = [...document.querySelectorAll("body *")]
    .filter((e) => { const r = e.getBoundingClientRect(); return r.width > 0 && r.right > width + 1; })
    .map((e) => `${e.tagName.toLowerCase()}${e.id ? "#" + e.id : ""}.${e.getAttribute("class") || ""}`);
  const broken = [];
  const oneLine = document.querySelectorAll("main td:not(.text), main th, main .id, main .tile-value, main .status");
  for (const box of oneLine) {
    if (box.closest("tr.empty")) continue;
    const texts = document.createTreeWalker(box, NodeFilter.SHOW_TEXT);
    for (let node = texts.nextNode(); node; node = texts.nextNode()) {
      if (!node.textContent.trim() || node.parentElement.closest(".list, .text, button")) continue;
      const range = document.createRange();
      range.selectNodeContents(node);
      const lines = new Set([...range.getClientRects()].map((r) => Math.round(r.top)));
      if (lines.size > 1) broken.push(node.textContent);
    }
  }
  return { scrollWidth: document.documentElement.scrollWidth, width, overflowing, broken };
}"""


def assert_laid_out(page: Page) -> None:
    """No horizontal overflow at the tab's width, and no id or name broken across lines."""
    found = page.evaluate(LAYOUT_PROBLEMS)
    assert found["scrollWidth"] <= found["width"], found
    assert found["overflowing"] == [], found
    assert found["broken"] == [], found


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
    return response.json()["data"]


def expect_jobs(page: Page, ids: set[str]) -> None:
    """Waits until the jobs table holds exactly these jobs (a count alone could still be the last table's)."""
    for job_id in ids:
        expect(page.locator(f'#jobs tbody tr[data-job="{job_id}"]')).to_have_count(1)
    expect(page.locator("#jobs tbody tr[data-job]")).to_have_count(len(ids))
    assert job_ids_in_table(page) == ids


def job_ids_in_table(page: Page) -> set[str]:
    return set(page.locator("#jobs tbody tr[data-job]").evaluate_all("rows => rows.map(r => r.dataset.job)"))


def _stats(system: Seeded, path: str) -> dict[str, Any]:
    response = httpx.get(f"{system.url}{path}", headers={"Authorization": f"Bearer {system.admin_key}"})
    response.raise_for_status()
    return response.json()


def test_every_page_loads_with_its_data_fits_1280_px_and_logs_no_errors(system: Seeded, tab: Tab) -> None:
    page = tab.page
    sign_in(page, system.url, system.admin_key)
    loaded(page)
    cards = page.locator("#gpus .card")
    expect(cards).to_have_count(2)
    expect(cards.first).to_contain_text("(simulated)")
    expect(page.locator("#gpus")).to_contain_text("of 24 GiB used")  # human units, not "24576 MiB"
    holders = [w for w in _workers(system) if MODEL in w["loaded_models"]]
    assert holders
    for holder in holders:
        expect(page.locator(f'#gpus .card[data-uuid="{holder["gpu_uuids"][0]}"] .models')).to_contain_text(MODEL)
    # Every job has finished: each GPU's worker waits, all its slots free.
    expect(cards.locator(".gpu-state").first).to_have_text(re.compile(r"^idle \d+ slots? free$"))
    expect(cards.locator('.gpu-state[data-state="idle"]')).to_have_count(2)
    summary = _stats(system, "/v1/stats/summary")
    expect(page.locator('#summary [data-tile="failed"] .tile-value')).to_have_text(str(summary["finished"]["failed"]))
    expect(page.locator('#summary [data-tile="queue wait"] .tile-detail')).to_have_text(re.compile(r"^p50 \d.* p95 \d"))
    expect(page.locator("#queues tbody tr[data-priority]")).to_have_count(3)
    expect(page.locator("#throughput svg polyline")).to_have_count(2)
    expect(page.locator("#failures")).to_contain_text(system.failed)
    expect(page.locator("#failure-reasons")).to_contain_text("Model path does not exist")
    assert_laid_out(page)
    screenshot(page, "overview")
    # A rule that changes nothing (both GPUs), so that the rules page has data too.
    rule = system.client.add_rule({"model_pattern": "smollm2-*", "effect": "allow", "gpu_indices": [0, 1]})["rule"]
    try:
        for path in PAGES[1:]:
            page.goto(f"{system.url}/dashboard{path}")  # the key stays in this tab's sessionStorage
            loaded(page)
            expect(page.locator("main tbody tr:not(.empty)").first).to_be_visible()  # a page with data
            assert_laid_out(page)
            screenshot(page, path.strip("/"))
    finally:
        system.client.delete_rule(rule["id"])
    expect(page.locator("#workers tbody tr[data-worker]")).to_have_count(2)  # the page now on screen
    for worker in _workers(system):
        slots = f"{worker['slots_busy']} of {worker['slots']} slot"
        expect(page.locator(f'#workers tr[data-worker="{worker["name"]}"] .slots')).to_contain_text(slots)

    page.goto(f"{system.url}/dashboard/schedules")
    page.get_by_role("button", name="History").click()
    expect(page.locator("#schedule-runs tbody tr")).to_have_count(1)
    expect(page.locator("#schedule-next li")).to_have_count(5)
    assert_laid_out(page)
    screenshot(page, "schedule-history")

    page.goto(f"{system.url}/dashboard/jobs/{system.failed}")
    expect(page.locator("#job-fields")).to_contain_text("fragile.gguf")  # the error
    expect(page.locator("#job-prompt")).to_have_text("hi")
    assert_laid_out(page)
    screenshot(page, "job-failed")
    page.goto(f"{system.url}/dashboard/jobs/{system.succeeded[0]}")
    expect(page.locator("#job-fields")).to_contain_text("succeeded")
    expect(page.locator("#job-timings")).to_contain_text(re.compile(r"queue wait\s*\d+(\.\d)? (ms|s)"))
    expect(page.locator("#job-timings")).to_contain_text("not measured (CPU or simulated GPU)")
    assert_laid_out(page)
    assert tab.errors == []


def _mib(value: float) -> str:
    """Memory as the dashboard writes it (js/dom.js mib()): "837 MiB", "1.5 GiB", "14 GiB"."""
    if value < 1024:
        return f"{round(value)} MiB"
    gib = value / 1024
    return (f"{gib:.1f}" if gib < 10 else f"{gib:.0f}").removesuffix(".0") + " GiB"


def _history(card: Any, measure: str) -> Any:
    return card.locator(f'.history-row[data-measure="{measure}"]')


def test_each_gpu_shows_an_hour_of_utilisation_memory_and_power(system: Seeded, tab: Tab) -> None:
    page = tab.page
    sign_in(page, system.url, system.admin_key)
    loaded(page)
    for gpu in _stats(system, "/v1/stats/gpus")["data"]:
        card = page.locator(f'#gpus .card[data-uuid="{gpu["uuid"]}"]')
        # A simulated GPU records its memory (the models its workers hold) and nothing else.
        expect(_history(card, "memory").locator("svg polyline").first).to_be_attached()
        latest = [p["memory_used_mib"] for p in gpu["series"] if p["memory_used_mib"] is not None][-1]
        expect(_history(card, "memory").locator(".history-value")).to_have_text(_mib(latest))
        for measure in ("utilisation", "power"):
            expect(_history(card, measure)).to_contain_text("no readings")
            expect(_history(card, measure).locator("svg")).to_have_count(0)
    screenshot(page, "overview-gpu-history-simulated")

    # On real GPUs NVML also reports utilisation and power (nothing here can), each minute's mean.
    def measured(body: dict[str, Any]) -> None:
        for gpu in body["data"]:
            for i, point in enumerate(gpu["series"]):
                point |= {"utilization_pct": 40 + i % 50, "power_w": 150.0 + i}
            if gpu["series"]:
                gpu["series"][-1] |= {"utilization_pct": 87, "power_w": 212.4}

    page.route("**/v1/stats/gpus", lambda route: _answer_changed(route, measured))
    page.reload()
    loaded(page)
    for card in page.locator("#gpus .card").all():
        expect(_history(card, "utilisation").locator(".history-value")).to_have_text("87 %")
        expect(_history(card, "power").locator(".history-value")).to_have_text("212 W")
        for measure in ("utilisation", "memory", "power"):
            expect(_history(card, measure).locator("svg polyline").first).to_be_attached()
    assert_laid_out(page)
    screenshot(page, "overview-gpu-history")
    assert tab.errors == []


def test_the_overview_shows_energy_per_model_and_says_where_none_was_measured(system: Seeded, tab: Tab) -> None:
    page = tab.page
    sign_in(page, system.url, system.admin_key)
    loaded(page)
    energy = _stats(system, "/v1/stats/energy")
    for model in energy["by_model"]:
        row = page.locator(f'#energy tr[data-model="{model["key"]}"]')
        expect(row).to_contain_text(str(model["jobs"]))
        expect(row).to_contain_text("not measured")  # simulated GPUs: no figure, not a zero
    expect(page.locator("#energy-note")).to_contain_text("jobs on the CPU or a simulated GPU have no figure")

    def measured(body: dict[str, Any]) -> None:  # as real GPUs report it
        model = next(m for m in body["by_model"] if m["key"] == MODEL)
        model |= {"energy_j": 43_200.0, "energy_jobs": model["jobs"], "gpu_seconds": 192.0, "gpu_seconds_jobs": 3}

    page.route("**/v1/stats/energy", lambda route: _answer_changed(route, measured))
    page.reload()
    loaded(page)
    row = page.locator(f'#energy tr[data-model="{MODEL}"]')
    expect(row).to_contain_text("12 Wh")  # 43.2 kJ
    expect(row).to_contain_text("3.2 min")  # 192 GPU-seconds
    assert_laid_out(page)
    screenshot(page, "overview-energy")
    assert tab.errors == []


def test_the_jobs_page_pages_through_every_job_older_and_newer(system: Seeded, tab: Tab) -> None:
    page = tab.page
    sign_in(page, system.url, system.admin_key, "/jobs")
    loaded(page)
    newest = system.client.jobs(limit=100)["data"]
    rows = page.locator("#jobs tbody tr[data-job]")
    expect(rows).to_have_count(50)
    first = job_ids_in_table(page)
    assert first == {j["id"] for j in newest[:50]}
    expect(page.locator("#jobs-range")).to_have_text("jobs 1\u201350, newest first")
    expect(page.locator("#jobs-newer")).to_be_disabled()

    page.click("#jobs-older")
    expect(page.locator("#jobs-range")).to_contain_text("jobs 51\u2013")
    expect_jobs(page, {j["id"] for j in newest[50:100]})
    assert "after=" in page.url
    assert_laid_out(page)
    screenshot(page, "jobs-page-2")
    page.click("#jobs-newer")
    expect(page.locator("#jobs-range")).to_have_text("jobs 1\u201350, newest first")
    expect_jobs(page, first)
    assert tab.errors == []


def test_the_batches_page_shows_failures_and_finish_times_and_downloads_both_files(system: Seeded, tab: Tab) -> None:
    batch = system.client.batch(system.batch_id)
    page = tab.page
    sign_in(page, system.url, system.admin_key, "/batches")
    loaded(page)
    row = page.locator(f'#batches tr[data-batch="{system.batch_id}"]')
    expect(row.locator("td.num")).to_have_text("1")  # one failed line, linked to its jobs
    finished = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(batch["completed_at"]))
    expect(row.locator(".finished")).to_have_text(finished)
    expect(row.locator(".bar")).to_contain_text("3 / 3")
    assert_laid_out(page)
    screenshot(page, "batches")
    admin = {"Authorization": f"Bearer {system.admin_key}"}
    for suffix, file_id in (("output", batch["output_file_id"]), ("errors", batch["error_file_id"])):
        with page.expect_download() as download:
            row.locator(f'button[data-file="{suffix}"]').click()
        assert download.value.suggested_filename == f"{system.batch_id}-{suffix}.jsonl"
        saved = Path(download.value.path()).read_bytes()
        assert saved == httpx.get(f"{system.url}/v1/files/{file_id}/content", headers=admin).content
        assert len(saved.splitlines()) == (2 if suffix == "output" else 1)
    row.locator("td.num a").click()
    [failed_line] = system.client.jobs(batch_id=system.batch_id, status="failed")["data"]
    expect_jobs(page, {failed_line["id"]})  # the failed line's job
    assert tab.errors == []


def test_schedule_times_are_shown_in_the_schedules_own_time_zone(system: Seeded, tab: Tab) -> None:
    page = tab.page
    sign_in(page, system.url, system.admin_key, "/schedules")
    loaded(page)
    [schedule] = system.client.schedules()["data"]
    row = page.locator(f'#schedules tr[data-schedule="{schedule["id"]}"]')
    # 0 2 * * * in Europe/Paris: 02:00 there (CET in winter, CEST in summer), 01:00 or 00:00 UTC.
    expect(row.locator('[data-time="next"]')).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d 02:00 CES?T$"))
    expect(row.locator('[data-time="next"]')).to_have_attribute("title", re.compile(r" 0[01]:00:00Z$"))
    page.get_by_role("button", name="History").click()
    expect(page.locator("#schedule-next li").first).to_have_text(re.compile(r" 02:00 CES?T$"))
    assert tab.errors == []


def test_the_sign_in_hint_names_a_command_that_makes_a_key(system: Seeded, tab: Tab) -> None:
    page = tab.page
    page.goto(f"{system.url}/dashboard")
    expect(page.locator("#key-hint")).to_contain_text("data/admin.key")
    command = page.locator("#key-command").inner_text().split()
    assert command[0] == "gpuq"
    screenshot(page, "sign-in")
    result = CliRunner(env={"GPUQ_DATABASE_URL": system.database_url}).invoke(main, command[1:])
    assert result.exit_code == 0, result.output
    secret = result.stdout.strip()
    sign_in(page, system.url, secret)
    loaded(page)  # the key it made is an admin key the dashboard accepts
    assert tab.errors == []


def test_the_job_filter_narrows_the_table_to_exactly_the_matching_jobs(system: Seeded, tab: Tab) -> None:
    page = tab.page
    sign_in(page, system.url, system.admin_key, "/jobs")
    loaded(page)
    everything = job_ids_in_table(page)
    assert {system.failed, *system.cancelled, *system.succeeded} <= everything
    # The doomed job and the batch's line for the same model: the two failures there are.
    [batch_line] = system.client.jobs(batch_id=system.batch_id, status="failed")["data"]
    failed = {system.failed, batch_line["id"]}

    page.select_option("#job-filter select[name=status]", "failed")
    page.click("#job-filter button[type=submit]")
    expect_jobs(page, failed)
    assert "status=failed" in page.url  # the filter is in the address, so it can be shared
    assert_laid_out(page)
    screenshot(page, "jobs-failed")

    page.select_option("#job-filter select[name=status]", "cancelled")
    page.click("#job-filter button[type=submit]")
    expect_jobs(page, set(system.cancelled))

    page.select_option("#job-filter select[name=status]", "")
    page.fill("#job-filter input[name=model]", "fragile")
    page.click("#job-filter button[type=submit]")
    expect_jobs(page, failed)
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
    loaded(page)
    assert_laid_out(page)
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
    expect(page.locator("#job-timings")).to_contain_text("12 J (shared GPU: 25 % of its energy")
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
