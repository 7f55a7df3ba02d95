"""/dashboard: the admin pages, served as HTML shells that hold no data.

Each page is ``shell.html`` with one page fragment from ``api/dashboard/templates/``. The
browser then calls the JSON API with the admin key the user typed into the page (kept in
``sessionStorage``), so these routes need no key: everything they return is the same for
every visitor. The scripts (plain ES modules, no build step) and the stylesheet are served
from ``api/dashboard/static/``; nothing comes from a CDN.
"""

from __future__ import annotations

from functools import cache
from html import escape
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, HTMLResponse

from gpuq.errors import RequestError

DASHBOARD_DIR = Path(__file__).resolve().parent.parent / "dashboard"
# The only files served under /dashboard/static/: their paths under static/, each with its
# content type. A path from the URL reaches the disk only once it equals an entry here, so
# nothing else can be read. Browsers run a module only when it comes as JavaScript, so every
# .js file is text/javascript. A new module must be added here (a test checks this list
# against the folder), or the pages that import it fail to load.
_JS = "text/javascript"
STATIC_FILES = {
    "app.css": "text/css",
    "js/main.js": _JS,
    "js/api.js": _JS,
    "js/auth.js": _JS,
    "js/chart.js": _JS,
    "js/dom.js": _JS,
    "js/downloads.js": _JS,
    "js/events.js": _JS,
    "js/refresh.js": _JS,
    "js/pages/batch.js": _JS,
    "js/pages/batches.js": _JS,
    "js/pages/job.js": _JS,
    "js/pages/jobs.js": _JS,
    "js/pages/overview.js": _JS,
    "js/pages/rules.js": _JS,
    "js/pages/schedules.js": _JS,
    "js/pages/workers.js": _JS,
    "js/pages/models.js": _JS,
    "js/pages/gpus.js": _JS,
    "js/pages/keys.js": _JS,
}
# Page name -> the title shown in the tab and the heading.
PAGES = {
    "overview": "Overview",
    "jobs": "Jobs",
    "job": "Job",
    "batches": "Batches",
    "batch": "Batch",
    "schedules": "Schedules",
    "rules": "Affinity rules",
    "workers": "Workers",
    "models": "Models",
    "gpus": "GPUs",
    "keys": "Keys and tenants",
}
# The shells change only with a new release, but a stale script would break a page.
NO_CACHE = {"Cache-Control": "no-cache"}
# What a browser may load and run on these pages: gpuq's own files and calls to its own API,
# nothing inline but style attributes (js/dom.js sets the bars' widths so), no plugins, and no
# framing by another site (clickjacking an admin's signed-in tab). Even a script injected
# somewhere would find nothing to load and nowhere to send an admin's key.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",  # frame-ancestors for browsers that predate it
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

router = APIRouter(prefix="/dashboard", tags=["dashboard"], include_in_schema=False)


@cache
def _template(name: str) -> str:
    return (DASHBOARD_DIR / "templates" / name).read_text(encoding="utf-8")


def render_page(page: str) -> str:
    """The shell with the page's fragment in it; ``data-page`` tells js/main.js which page module to run."""
    return (
        _template("shell.html")
        .replace("{{title}}", escape(PAGES[page]))
        .replace("{{page}}", page)
        .replace("{{content}}", _template(f"{page}.html"))
    )


def _page(page: str) -> HTMLResponse:
    return HTMLResponse(render_page(page), headers=NO_CACHE | SECURITY_HEADERS)


@router.get("", response_class=HTMLResponse)
async def overview() -> HTMLResponse:
    return _page("overview")


@router.get("/jobs", response_class=HTMLResponse)
async def jobs() -> HTMLResponse:
    return _page("jobs")


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
async def job(job_id: str) -> HTMLResponse:
    # The id is read by js/pages/job.js from the address, never written into the HTML.
    return _page("job")


@router.get("/batches", response_class=HTMLResponse)
async def batches() -> HTMLResponse:
    return _page("batches")


@router.get("/batches/{batch_id}", response_class=HTMLResponse)
async def batch(batch_id: str) -> HTMLResponse:
    # The id is read by js/pages/batch.js from the address, never written into the HTML.
    return _page("batch")


@router.get("/schedules", response_class=HTMLResponse)
async def schedules() -> HTMLResponse:
    return _page("schedules")


@router.get("/rules", response_class=HTMLResponse)
async def rules() -> HTMLResponse:
    return _page("rules")


@router.get("/workers", response_class=HTMLResponse)
async def workers() -> HTMLResponse:
    return _page("workers")


@router.get("/models", response_class=HTMLResponse)
async def models() -> HTMLResponse:
    return _page("models")


@router.get("/gpus", response_class=HTMLResponse)
async def gpus() -> HTMLResponse:
    return _page("gpus")


@router.get("/keys", response_class=HTMLResponse)
async def keys() -> HTMLResponse:
    return _page("keys")


@router.get("/static/{name:path}")
async def static(name: str) -> FileResponse:
    # `name` may hold slashes (js/pages/jobs.js); only an exact entry of the list is served.
    if name not in STATIC_FILES:
        raise RequestError(404, f"no dashboard file {name!r}")
    return FileResponse(
        DASHBOARD_DIR / "static" / name, media_type=STATIC_FILES[name], headers=NO_CACHE | SECURITY_HEADERS
    )
