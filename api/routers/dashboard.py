"""/dashboard: the admin pages, served as HTML shells that hold no data.

Each page is ``shell.html`` with one page fragment from ``api/dashboard/templates/``. The
browser then calls the JSON API with the admin key the user typed into the page (kept in
``sessionStorage``), so these routes need no key: everything they return is the same for
every visitor. The script and stylesheet are served from ``api/dashboard/static/``; nothing
comes from a CDN.
"""

from __future__ import annotations

from functools import cache
from html import escape
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, HTMLResponse

from gpuq.errors import RequestError

DASHBOARD_DIR = Path(__file__).resolve().parent.parent / "dashboard"
# The only files served under /dashboard/static/, by name: no path from the URL touches the disk.
STATIC_FILES = {"app.js": "text/javascript", "app.css": "text/css"}
# Page name -> the title shown in the tab and the heading.
PAGES = {
    "overview": "Overview",
    "jobs": "Jobs",
    "job": "Job",
    "batches": "Batches",
    "schedules": "Schedules",
    "rules": "Affinity rules",
    "workers": "Workers",
}
# The shells change only with a new release, but a stale script would break a page.
NO_CACHE = {"Cache-Control": "no-cache"}

router = APIRouter(prefix="/dashboard", tags=["dashboard"], include_in_schema=False)


@cache
def _template(name: str) -> str:
    return (DASHBOARD_DIR / "templates" / name).read_text(encoding="utf-8")


def render_page(page: str) -> str:
    """The shell with the page's fragment in it; ``data-page`` tells app.js what to load."""
    return (
        _template("shell.html")
        .replace("{{title}}", escape(PAGES[page]))
        .replace("{{page}}", page)
        .replace("{{content}}", _template(f"{page}.html"))
    )


def _page(page: str) -> HTMLResponse:
    return HTMLResponse(render_page(page), headers=NO_CACHE)


@router.get("", response_class=HTMLResponse)
async def overview() -> HTMLResponse:
    return _page("overview")


@router.get("/jobs", response_class=HTMLResponse)
async def jobs() -> HTMLResponse:
    return _page("jobs")


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
async def job(job_id: str) -> HTMLResponse:
    # The id is read by app.js from the address, never written into the HTML.
    return _page("job")


@router.get("/batches", response_class=HTMLResponse)
async def batches() -> HTMLResponse:
    return _page("batches")


@router.get("/schedules", response_class=HTMLResponse)
async def schedules() -> HTMLResponse:
    return _page("schedules")


@router.get("/rules", response_class=HTMLResponse)
async def rules() -> HTMLResponse:
    return _page("rules")


@router.get("/workers", response_class=HTMLResponse)
async def workers() -> HTMLResponse:
    return _page("workers")


@router.get("/static/{name}")
async def static(name: str) -> FileResponse:
    if name not in STATIC_FILES:
        raise RequestError(404, f"no dashboard file {name!r}")
    return FileResponse(DASHBOARD_DIR / "static" / name, media_type=STATIC_FILES[name], headers=NO_CACHE)
