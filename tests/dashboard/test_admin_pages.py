"""The dashboard's models, GPUs and keys pages in headless Chromium, against real gpuq processes.

One system for the module: the API, the scheduler and a supervisor running two workers on
simulated GPUs (24 and 80 GiB, sampled every second), one of which has loaded the bundled
model for an embedding. The browser, the tabs (strict CSP, console errors recorded) and the layout checks
are test_dashboard.py's; each page is also checked at 800 px, and for sections drawn over one
another. Screenshots go to test-artifacts/screenshots/.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, ViewportSize, expect
from redis import Redis

from gpuq.cli.client import GpuqClient
from gpuq.db.engine import sync_engine, sync_sessions
from gpuq.fleet import health
from gpuq.testing import GpuqProcesses
from tests.conftest import RedisDbs, fresh_database, migrate_and_register, redis_db
from tests.dashboard import test_dashboard as shared
from tests.dashboard.test_dashboard import MODEL, Tab, _mib, assert_laid_out, loaded, screenshot, sign_in

# test_dashboard.py's browser (one for this module) and tabs (strict CSP, errors recorded).
browser = shared.browser
tab = shared.tab

pytestmark = pytest.mark.e2e

NARROW: ViewportSize = {"width": 800, "height": 900}


@dataclass
class System:
    url: str
    admin_key: str
    client: GpuqClient
    database_url: str
    redis_url: str
    workdir: Path
    model_path: str


@pytest.fixture(scope="module")
def system(
    tmp_path_factory: pytest.TempPathFactory, redis_server_url: str, redis_dbs: RedisDbs, model_path: str
) -> Iterator[System]:
    workdir = tmp_path_factory.mktemp("dashboard-admin")
    (workdir / "models").mkdir()
    with fresh_database("sqlite", workdir) as database_url, redis_db(redis_server_url, redis_dbs.spare) as redis_url:
        migrate_and_register(database_url)
        settings = {"GPUQ_SIMULATED_GPUS": "24,80", "GPUQ_GPU_SAMPLE_INTERVAL_S": "1"}
        processes = GpuqProcesses(database_url, redis_url, workdir, settings=settings)
        try:
            _api, url = processes.start_api()
            with processes.client(url) as client:
                processes.start_supervisor(expected_workers=2)
                processes.start_scheduler()  # finalises batches: their output files
                job = client.submit({"kind": "embed", "model": MODEL, "input": "hi"})
                assert client.wait(job["id"], timeout_s=120)["status"] == "succeeded"
                yield System(url, processes.admin_key, client, database_url, redis_url, workdir, model_path)
        except Exception:
            print(processes.logs())
            raise
        finally:
            processes.stop_all()


def _get(system: System, path: str, key: str | None = None) -> httpx.Response:
    return httpx.get(f"{system.url}{path}", headers={"Authorization": f"Bearer {key or system.admin_key}"})


def _data(system: System, path: str) -> Any:
    response = _get(system, path)
    response.raise_for_status()
    return response.json()["data"]


# Sibling boxes (the page's sections, the columns, the cards) that are drawn over one another.
OVERLAPS = """() => {
  const boxes = [...document.querySelectorAll("main > *, main .columns > *, #gpu-hosts > *, main .cards > *")]
    .filter((e) => { const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0; });
  const name = (e) => `${e.tagName.toLowerCase()}${e.id ? "#" + e.id : ""}.${e.getAttribute("class") || ""}`;
  const found = [];
  boxes.forEach((a, i) => boxes.slice(i + 1).forEach((b) => {
    if (a.parentElement !== b.parentElement) return;
    const r = a.getBoundingClientRect(), s = b.getBoundingClientRect();
    const x = Math.min(r.right, s.right) - Math.max(r.left, s.left);
    const y = Math.min(r.bottom, s.bottom) - Math.max(r.top, s.top);
    if (x > 1 && y > 1) found.push(`${name(a)} / ${name(b)}`);
  }));
  return found;
}"""


def assert_fits_both_widths(page: Page, name: str) -> None:
    """Laid out (no overflow, nothing broken across lines) and no sections overlapping, at
    1280 px and at 800 px, with a screenshot of each."""
    wide: ViewportSize = {"width": 1280, "height": 900}
    for viewport, suffix in ((wide, ""), (NARROW, "-800")):
        page.set_viewport_size(viewport)
        assert_laid_out(page)
        assert page.evaluate(OVERLAPS) == []
        screenshot(page, f"{name}{suffix}")
    page.set_viewport_size({"width": 1280, "height": 900})


def test_the_models_page_shows_where_each_model_is_loaded_and_registers_and_unloads_one(
    system: System, tab: Tab
) -> None:
    [holder] = [w for w in _data(system, "/v1/workers") if MODEL in w["loaded_models"]]
    gpus = {g["uuid"]: g for g in _data(system, "/v1/gpus")}
    [registered] = [m for m in _data(system, "/v1/models") if m["id"] == MODEL]
    page = tab.page
    sign_in(page, system.url, system.admin_key, "/models")
    loaded(page)
    row = page.locator(f'#models tr[data-model="{MODEL}"]')
    place = gpus[holder["gpu_uuids"][0]]
    expect(row.locator("td.loaded")).to_have_text(f"{place['host']} / {place['index']} (sim) ({holder['name']})")
    expect(row.locator("td.vram")).to_have_text(f"{_mib(registered['vram_estimate_mib'])} estimated")
    assert_fits_both_widths(page, "models")

    # Registered from the page: a second name for the bundled file, for embeddings, with a measured figure.
    (system.workdir / "models" / "extra.gguf").symlink_to(system.model_path)
    form = page.locator("#model-form")
    form.locator("input[name=name]").fill("extra")
    form.locator("input[name=path]").fill("extra.gguf")
    form.locator("select[name=kinds]").select_option("embed")
    form.locator("input[name=vram_mib]").fill("900")
    form.locator("button[type=submit]").click()
    extra = page.locator('#models tr[data-model="extra"]')
    expect(extra.locator("td.vram")).to_have_text("900 MiB measured")
    expect(extra.locator("td.loaded")).to_have_text("not loaded")
    model = _get(system, "/v1/models/extra").json()
    assert (model["kinds"], model["vram_mib"]) == (["embed"], 900)

    # A file that is not there is refused with the API's reason, and nothing is registered.
    form.locator("input[name=name]").fill("missing")
    form.locator("input[name=path]").fill("missing.gguf")
    form.locator("button[type=submit]").click()
    expect(page.locator("#message")).to_contain_text("missing.gguf")
    assert _get(system, "/v1/models/missing").status_code == 404

    row.get_by_role("button", name="Unload").click()
    expect(row.locator("td.loaded")).to_have_text("not loaded")  # once the worker has let it go
    assert [w["loaded_models"] for w in _data(system, "/v1/workers") if MODEL in w["loaded_models"]] == []
    expect(row.get_by_role("button", name="Unload")).to_have_count(0)
    # Chromium logs the refused registration (422) itself as a console error; nothing else may be reported.
    assert [e for e in tab.errors if "422" not in e] == []


def test_the_gpus_page_shows_each_hosts_gpus_their_marks_and_history_and_clears_them(system: System, tab: Tab) -> None:
    gpus = sorted(_data(system, "/v1/gpus"), key=lambda g: g["index"])
    sick, small = gpus[0]["uuid"], gpus[1]["uuid"]
    engine = sync_engine(system.database_url)  # as a worker does after repeated CUDA errors
    health.mark_unhealthy(sync_sessions(engine), [sick], "3 CUDA errors in a row")
    engine.dispose()
    redis = Redis.from_url(system.redis_url)
    health.mark_too_small(redis, (small,), "big-model", ttl_s=3600)  # as an out-of-memory load on it alone does
    redis.close()
    page = tab.page
    sign_in(page, system.url, system.admin_key, "/gpus")
    loaded(page)
    [host] = {g["host"] for g in gpus}
    expect(page.locator(f'#gpu-hosts section[data-host="{host}"] h2')).to_have_text(host)
    sick_card, small_card = (page.locator(f'#gpu-hosts .card[data-uuid="{u}"]') for u in (sick, small))
    expect(sick_card.locator(".gpu-health")).to_have_text("unhealthy 3 CUDA errors in a row")
    expect(small_card.locator(".gpu-health")).to_have_text("healthy")
    expect(small_card.locator(".too-small")).to_have_text("too small for: big-model")
    expect(sick_card.locator(".too-small")).to_have_count(0)
    for uuid in (sick, small):  # an hour of samples: memory (a simulated GPU records nothing else)
        card = page.locator(f'#gpu-hosts .card[data-uuid="{uuid}"]')
        expect(card.locator('.history-row[data-measure="memory"] svg polyline').first).to_be_attached()
        expect(card.locator('.history-row[data-measure="power"]')).to_contain_text("no readings")
    marked = page.locator('#gpu-event-list tr[data-kind="gpu_unhealthy"]')
    expect(marked).to_have_count(1)
    expect(marked).to_contain_text(f"{host} / {gpus[0]['index']}")
    expect(marked.locator("td.text")).to_have_text("3 CUDA errors in a row")
    assert_fits_both_widths(page, "gpus")

    for card in (sick_card, small_card):
        card.get_by_role("button", name="Clear").click()
        expect(card.get_by_role("button", name="Clear")).to_have_count(0)
    expect(sick_card.locator(".gpu-health")).to_have_text("healthy")
    expect(small_card.locator(".too-small")).to_have_count(0)
    expect(page.locator('#gpu-event-list tr[data-kind="gpu_cleared"]')).to_have_count(2)
    after = {g["uuid"]: g for g in _data(system, "/v1/gpus")}
    assert after[sick]["healthy"] and after[sick]["unhealthy_reason"] is None
    assert after[small]["too_small_for"] == []
    assert tab.errors == []


def test_the_keys_page_lists_usage_and_creates_a_key_shown_once_and_revokes_it(system: System, tab: Tab) -> None:
    admin = {"Authorization": f"Bearer {system.admin_key}"}
    body = {"name": "evals", "owner": "acme", "role": "submitter", "max_queued_jobs": 5}
    acme = httpx.post(f"{system.url}/v1/keys", json=body, headers=admin).json()
    for _ in range(2):
        submitted = httpx.post(
            f"{system.url}/v1/jobs",
            json={"kind": "noop", "model": MODEL},
            headers={"Authorization": f"Bearer {acme['key']}"},
        )
        assert submitted.status_code == 202
    page = tab.page
    sign_in(page, system.url, system.admin_key, "/keys")
    loaded(page)
    row = page.locator(f'#keys tr[data-key="{acme["id"]}"]')
    expect(row).to_contain_text("acme")
    expect(row).to_contain_text("5 queued")
    expect(row.locator("td.usage")).to_have_text(re.compile(r"^2 jobs · \d+ tokens?$"))
    expect(page.locator('#tenants tr[data-tenant="acme"]')).to_contain_text("2")
    expect(page.locator("#keys")).to_contain_text("(this tab's key)")
    assert_fits_both_widths(page, "keys")

    # A key made in the page: its secret shown once, working, and its name drawn as text.
    name = '<img src=x onerror="window.injected=1">'
    form = page.locator("#key-form")
    form.locator("input[name=name]").fill(name)
    form.locator("input[name=owner]").fill("globex")
    form.locator("input[name=max_submissions_per_minute]").fill("30")
    form.locator("button[type=submit]").click()
    secret_box = page.locator("#key-secret-value")
    expect(secret_box).to_have_text(re.compile(r"^gpuq_"))
    secret = secret_box.inner_text()
    me = _get(system, "/v1/keys/me", secret).json()
    assert (me["name"], me["owner"], me["role"], me["max_submissions_per_minute"]) == (name, "globex", "submitter", 30)
    created = page.locator(f'#keys tr[data-key="{me["id"]}"]')
    expect(created).to_contain_text(name)
    assert created.locator("img").count() == 0 and page.evaluate("window.injected") is None
    expect(page.locator('#tenants tr[data-tenant="globex"]')).to_have_count(1)
    screenshot(page, "keys-created")

    created.get_by_role("button", name="Revoke").click()
    expect(created).to_have_count(0)
    assert _get(system, "/v1/keys/me", secret).status_code == 401
    assert tab.errors == []


def test_the_workers_page_says_a_killed_worker_crashed_and_counts_its_slots_restarts(system: System, tab: Tab) -> None:
    victim = sorted(_data(system, "/v1/workers"), key=lambda w: w["name"])[0]
    pid = int(victim["name"].split(".")[-2])  # worker names: host.slot.pid.xxxx
    os.kill(pid, signal.SIGKILL)  # as the OOM killer or a CUDA abort would
    page = tab.page
    sign_in(page, system.url, system.admin_key, "/workers")
    loaded(page)
    crashed = page.locator('#worker-events tr[data-kind="crashed"]')
    expect(crashed).to_have_count(1)  # the page refreshes until the supervisor has seen it
    expect(crashed.locator("td.text")).to_have_text("crashed: killed by SIGKILL")
    expect(crashed).to_contain_text(f"{victim['host']} / {victim['slot']}")
    expect(page.locator('#worker-events tr[data-kind="restarted"]')).to_have_count(1)
    # The successor, once it has registered: a new name, and its slot's restart counted.
    expect(page.locator("#workers .restarts", has_text="1 restart")).to_have_count(1)
    [successor] = [w for w in _data(system, "/v1/workers") if w["slot"] == victim["slot"]]
    assert successor["name"] != victim["name"] and successor["restarts"] == 1
    expect(page.locator(f'#workers tr[data-worker="{successor["name"]}"] .restarts')).to_have_text("1 restart")
    # Each worker's prefix cache beneath its models, in lines short enough for the column.
    cache = page.locator(f'#workers tr[data-worker="{successor["name"]}"] .prefix-cache')
    expect(cache.first).to_have_text(re.compile(r"^cache: \d+ starts?, \d+ MiB of \d+ MiB$"))
    expect(cache.last).to_have_text(re.compile(r"^\d+ hits?, \d+ miss(es)?$"))
    assert_fits_both_widths(page, "workers-events")
    page.goto(f"{system.url}/dashboard/gpus")  # a crash of a GPU's worker is also the GPU's news
    loaded(page)
    expect(page.locator('#gpu-event-list tr[data-kind="crashed"]')).to_have_count(1)
    assert tab.errors == []


def test_the_overview_shows_throughput_apart_from_decode_speed_and_a_failed_count_of_0_not_red(
    system: System, tab: Tab
) -> None:
    summary = _get(system, "/v1/stats/summary").json()
    assert summary["finished"]["failed"] == 0
    page = tab.page
    sign_in(page, system.url, system.admin_key)
    loaded(page)
    tiles = page.locator("#summary")
    usage = summary["usage"]
    expect(tiles.locator('[data-tile="throughput"] .tile-value')).to_have_text(re.compile(r"^\d+\.\d tok/s$"))
    expect(tiles.locator('[data-tile="throughput"] .tile-detail')).to_have_text(
        f"completion tokens per second of the hour: {usage['completion_tokens']} completion, "
        f"{usage['prompt_tokens']} prompt"
    )
    expect(tiles.locator('[data-tile="decode speed"] .tile-detail')).to_have_text("per sequence, while decoding")
    expect(tiles.locator('[data-tile="tokens/s"]')).to_have_count(0)  # the one figure that said both
    colour = "(e) => getComputedStyle(e).color"
    failed = tiles.locator('[data-tile="failed"] .tile-value')
    expect(failed).to_have_text("0")
    assert failed.evaluate(colour) == tiles.locator('[data-tile="queued"] .tile-value').evaluate(colour)
    expect(page.locator("#energy thead")).to_contain_text("tokens prompt + completion")
    row = page.locator(f'#energy tr[data-model="{MODEL}"]')
    expect(row.locator("td").nth(2)).to_have_text(re.compile(r"^\d+ \+ \d+$"))
    # Each tenant's share of the fleet: the admin's jobs are all that ran, so all of the hour's.
    shares = {t["tenant"]: t for t in _get(system, "/v1/stats/tenants").json()["data"]}
    tenant = page.locator('#tenants tr[data-tenant="admin"]')
    expect(tenant.locator("td").first).to_have_text("admin")
    expect(tenant.locator("td").nth(4)).to_have_text(re.compile(rf"^100% \({shares['admin']['finished']} jobs, "))
    assert_laid_out(page)
    screenshot(page, "overview-figures")
    assert tab.errors == []


def test_the_jobs_page_shows_what_each_job_asks_its_batch_and_a_running_jobs_progress(system: System, tab: Tab) -> None:
    embedding = {
        "custom_id": "emb-1",
        "method": "POST",
        "url": "/v1/embeddings",
        "body": {"model": MODEL, "input": "x"},
    }
    chat = {
        "custom_id": "chat-1",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    }
    path = system.workdir / "mixed.jsonl"
    path.write_text(f"{json.dumps(chat)}\n{json.dumps(embedding)}\n")
    batch = system.client.create_batch(system.client.upload(str(path))["id"], endpoint="/v1/chat/completions")
    asked = system.client.submit({"kind": "generate", "model": MODEL, "prompt": "Name three  primary\ncolours."})
    # A job seen while it runs: a quick job never stays running, so its listing is made so.
    running = {
        "status": "running",
        "started_at": (datetime.now(UTC) - timedelta(seconds=42)).isoformat(),
        "completion_tokens": None,
        "run_ms": None,
        "tokens_so_far": 17,
    }

    def make_running(body: dict[str, Any]) -> None:
        for job in body["data"]:
            if job["id"] == asked["id"]:
                job.update(running)

    page = tab.page
    page.route("**/v1/jobs?*", lambda route: shared._answer_changed(route, make_running))
    sign_in(page, system.url, system.admin_key, "/jobs")
    loaded(page)
    row = page.locator(f'#jobs tr[data-job="{asked["id"]}"]')
    expect(row.locator(".snippet")).to_have_text("Name three primary colours.")
    expect(row.locator("td.run")).to_contain_text(re.compile(r"^4\d s so far"))
    expect(row.locator("td.tokens")).to_have_text(re.compile(r"^\d+ \+ 17 so far$"))
    lines = page.locator(f'#jobs tr:has(td.asked a[title="{batch["id"]}"])')
    expect(lines).to_have_count(2)  # the embedding line and the chat line
    expect(page.locator("#jobs .snippet", has_text="emb-1")).to_have_count(1)
    expect(page.locator("#jobs .snippet", has_text="chat-1")).to_have_count(1)
    assert_fits_both_widths(page, "jobs-snippets")
    page.goto(f"{system.url}/dashboard/batches")
    loaded(page)
    endpoint = page.locator(f'#batches tr[data-batch="{batch["id"]}"] td.endpoint')
    expect(endpoint.locator(".name")).to_have_text("mixed")
    expect(endpoint).to_have_attribute("title", "/v1/chat/completions, /v1/embeddings")
    assert tab.errors == []


def test_a_schedule_made_and_edited_in_the_page_runs_and_its_batch_page_shows_how_it_went(
    system: System, tab: Tab
) -> None:
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
    lines = [
        {"custom_id": "greet-1", "method": "POST", "url": "/v1/chat/completions", "body": chat},
        {"custom_id": "greet-2", "method": "POST", "url": "/v1/chat/completions", "body": chat},
        {"custom_id": "vec-1", "method": "POST", "url": "/v1/embeddings", "body": {"model": MODEL, "input": "x"}},
    ]
    page = tab.page
    sign_in(page, system.url, system.admin_key, "/schedules")
    loaded(page)
    form = page.locator("#schedule-form")
    form.locator("input[name=name]").fill("nightly-greetings")
    form.locator("input[name=cron]").fill("0 2 * * *")
    form.locator("input[name=timezone]").fill("Europe/Paris")
    form.locator("textarea[name=requests]").fill("\n".join(json.dumps(line) for line in lines))
    expect(form.locator("input[name=completion_window]")).to_have_value("24h")  # the API's default
    form.locator("input[name=completion_window]").fill("6h")
    form.locator("button[type=submit]").click()
    row = page.locator("#schedules tbody tr", has_text="nightly-greetings")
    expect(row).to_have_count(1)
    [made] = [s for s in system.client.schedules()["data"] if s["name"] == "nightly-greetings"]
    assert (made["cron"], made["timezone"], made["priority"], made["enabled"], made["completion_window"]) == (
        "0 2 * * *",
        "Europe/Paris",
        "low",
        True,
        "6h",
    )
    expect(row.locator("td.name")).to_contain_text("enabled · low · 6h window")
    expect(row.locator('[data-time="last"]')).to_have_text("never run")

    row.get_by_role("button", name="Edit").click()
    expect(form.locator("input[name=name]")).to_be_disabled()  # the name and input stay
    expect(form.locator("input[name=completion_window]")).to_have_value("6h")
    form.locator("input[name=cron]").fill("30 3 * * 1")
    form.locator("select[name=priority]").select_option("normal")
    form.locator("input[name=completion_window]").fill("12h")
    form.locator("button[type=submit]").click()
    expect(row.locator("td.cron .cron-expr")).to_have_text("30 3 * * 1")
    expect(row.locator("td.name")).to_contain_text("enabled · normal · 12h window")
    edited = system.client.schedules("GET", f"/{made['id']}")
    assert (edited["name"], edited["cron"], edited["priority"], edited["completion_window"]) == (
        "nightly-greetings",
        "30 3 * * 1",
        "normal",
        "12h",
    )
    expect(page.locator("#schedule-form-title")).to_have_text("Create a schedule")

    row.get_by_role("button", name="Run now").click()
    deadline = time.monotonic() + 180
    while not (runs := system.client.schedules("GET", f"/{made['id']}/runs")["data"]) or not runs[0]["batch_id"]:
        assert time.monotonic() < deadline and not (runs and runs[0]["error"]), runs
        time.sleep(0.2)
    [run] = runs
    assert system.client.batch(run["batch_id"])["completion_window"] == "12h"  # the window as edited
    while system.client.batch(run["batch_id"])["status"] != "completed":
        assert time.monotonic() < deadline, system.client.batch(run["batch_id"])
        time.sleep(0.5)
    # Beside the run's time, how it went: the batch's status and its lines.
    expect(row.locator('[data-time="last"] .outcome')).to_have_text("completed 3 of 3 lines")
    row.get_by_role("button", name="History").click()
    history = page.locator("#schedule-runs tbody tr")
    expect(history).to_have_count(1)
    expect(history.locator("td").nth(1)).to_have_text("completed 3 of 3 lines")
    assert_fits_both_widths(page, "schedules-made")

    history.locator("a").click()
    expect(page).to_have_url(f"{system.url}/dashboard/batches/{run['batch_id']}")
    loaded(page)
    expect(page.locator("#batch-fields")).to_contain_text(f"nightly-greetings (schedule {made['id']})")
    expect(page.locator("#batch-fields")).to_contain_text("mixed: /v1/chat/completions, /v1/embeddings")
    due = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(system.client.batch(run["batch_id"])["expires_at"]))
    expect(page.locator("#batch-fields")).to_contain_text(f"12h, due {due}")  # its lines' deadline
    expect(page.locator('#batch-counts tr[data-status="succeeded"] td.num')).to_have_text("3")
    expect(page.locator("#batch-pace")).to_contain_text("finished")
    expect(page.locator("#batch-jobs tbody tr[data-job]")).to_have_count(3)
    for custom_id in ("greet-1", "greet-2", "vec-1"):
        expect(page.locator("#batch-jobs tbody", has_text=custom_id)).to_have_count(1)
    expect(page.locator("#batch-cancel")).to_be_hidden()
    assert_fits_both_widths(page, "batch")
    with page.expect_download() as download:
        page.locator('#batch-files button[data-file="output"]').click()
    output = Path(download.value.path()).read_text().splitlines()
    assert sorted(json.loads(line)["custom_id"] for line in output) == ["greet-1", "greet-2", "vec-1"]
    assert tab.errors == []


def test_every_page_fits_800_and_1280_px_with_no_section_over_another_and_no_errors(system: System, tab: Tab) -> None:
    client = system.client
    path = system.workdir / "every-page.jsonl"
    line = {"custom_id": "v", "method": "POST", "url": "/v1/embeddings", "body": {"model": MODEL, "input": "x"}}
    path.write_text(json.dumps(line) + "\n")
    batch = client.create_batch(client.upload(str(path))["id"], endpoint="/v1/embeddings")
    client.schedules("POST", json={"name": "every-page", "cron": "0 4 * * *", "requests": [line]})
    [job] = client.jobs(limit=1)["data"]
    # A rule that keeps the model off every GPU: its reason is the same for each GPU of the preview.
    rule = client.add_rule({"model_pattern": MODEL, "effect": "deny", "kind": "generate", "precedence": 5})["rule"]
    page = tab.page
    try:
        sign_in(page, system.url, system.admin_key)
        paths = ["", "/jobs", f"/jobs/{job['id']}", "/batches", f"/batches/{batch['id']}", "/schedules"]
        paths += ["/rules", "/workers", "/models", "/gpus", "/keys"]
        for path_ in paths:
            page.goto(f"{system.url}/dashboard{path_}")
            loaded(page)
            if path_ == "/rules":
                page.locator("#preview-model").select_option(MODEL)
                page.locator("#preview-form select[name=kind]").select_option("generate")
                page.locator("#preview-form button[type=submit]").click()
                expect(page.locator("#preview tbody tr")).to_have_count(2)
                # The rule's reason and how the VRAM figure is estimated, each once under the
                # table, and each GPU's row referring to them.
                notes = page.locator("#preview-notes li")
                expect(notes).to_have_count(2)
                expect(notes.first).to_contain_text(f"rule {rule['id']}")
                expect(notes.nth(1)).to_contain_text("estimate for generation")
                reasons = page.locator("#preview tbody td.text")
                expect(reasons).to_have_text(
                    [re.compile(r"^see \(1\); fits: needs \d+ MiB of \d+ MiB \(see \(2\)\)$")] * 2
                )
            if path_ == "":
                chart = page.locator("#throughput svg")
                ticks = chart.locator("text.x-tick").all_text_contents()  # every 10 minutes of the hour
                assert 5 <= len(ticks) <= 7 and all(re.fullmatch(r"\d\d:\d0", t) for t in ticks), ticks
                legend_bottom = chart.locator("text.legend").first.bounding_box()
                plot_top = chart.locator("line.axis").nth(1).bounding_box()
                assert legend_bottom and plot_top and legend_bottom["y"] + legend_bottom["height"] <= plot_top["y"] + 1
                expect(chart.locator("text.legend.failed")).to_have_text("failed: none")  # not a red line on the axis
                expect(chart.locator("polyline.failed")).to_have_count(0)
            name = path_.strip("/").split("/")[0] or "overview"
            assert_fits_both_widths(page, f"every-{name}{'-one' if path_.count('/') > 1 else ''}")
    finally:
        client.delete_rule(rule["id"])
    assert tab.errors == []
