"""`gpuq schedules`: cron schedules of batch runs, through the API. A schedule is named by
its number or its name (names are unique); times are shown in the schedule's own time zone."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import click

from gpuq.cli.batches import completion_window_option, first_endpoint
from gpuq.cli.client import GpuqClient
from gpuq.cli.errors import stop
from gpuq.cli.support import connect, table, url_option

schedule_argument = click.argument("schedule", metavar="SCHEDULE")


def find_schedule(client: GpuqClient, ref: str) -> dict[str, Any]:
    """The schedule numbered or named ``ref`` (a number is an id first, as `schedules list` shows it)."""
    listed: list[dict[str, Any]] = client.schedules()["data"]
    by_id = [s for s in listed if ref.isdigit() and s["id"] == int(ref)]
    found = by_id or [s for s in listed if s["name"] == ref]
    if not found:
        stop(f"no schedule {ref!r} (by number or name); `gpuq schedules list` shows them")
    return found[0]


def local_time(stamp: str | None, timezone: str) -> str:
    """An API time (ISO 8601, UTC) in the schedule's zone: ``2026-12-02 02:00 CET``."""
    if not stamp:
        return ""
    return datetime.fromisoformat(stamp).astimezone(ZoneInfo(timezone)).strftime("%Y-%m-%d %H:%M %Z")


def _named(s: dict[str, Any]) -> str:
    return f"schedule {s['id']} ({s['name']})"


@click.group()
def schedules() -> None:
    """Cron schedules of batch runs (SCHEDULE: its number or its name)."""


@schedules.command("list")
@url_option
def schedules_list(url: str) -> None:
    """Every schedule, its times in its own time zone."""
    with connect(url) as client:
        data = client.schedules()["data"]
    table(
        ("ID", "NAME", "CRON", "TZ", "ENABLED", "MISFIRE", "WINDOW", "NEXT", "LAST"),
        [
            (
                str(s["id"]),
                s["name"],
                s["cron"],
                s["timezone"],
                "yes" if s["enabled"] else "paused",
                s["misfire"],
                s.get("completion_window") or "24h",  # an API older than the field ran every batch in 24h
                local_time(s["next_fire_at"], s["timezone"]),
                local_time(s["last_fired_at"], s["timezone"]),
            )
            for s in data
        ],
        empty="no schedules (`gpuq schedules add NAME CRON FILE` makes one)",
    )


@schedules.command("add")
@url_option
@click.argument("name")
@click.argument("cron")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--timezone", default="UTC", show_default=True)
@click.option("--misfire", type=click.Choice(["skip", "run_once"]), default="skip", show_default=True)
@click.option("--priority", default="low", show_default=True)
@completion_window_option(
    "each run's batch's window, its lines' deadline from the run's start (a run the fleet cannot finish in it "
    "starts no batch, and `gpuq schedules runs` says why)"
)
def schedules_add(
    url: str, name: str, cron: str, path: str, timezone: str, misfire: str, priority: str, completion_window: str
) -> None:
    """Run the batch file PATH on CRON (e.g. '0 2 * * *'); the file is uploaded once."""
    with connect(url) as client:
        file = client.upload(path)
        created = client.schedules(
            "POST",
            json={
                "name": name,
                "cron": cron,
                "timezone": timezone,
                "input_file_id": file["id"],
                "endpoint": first_endpoint(path),
                "misfire": misfire,
                "priority": priority,
                "completion_window": completion_window,
            },
        )
    click.echo(f"{_named(created)}: next run {local_time(created['next_fire_at'], created['timezone'])}")


@schedules.command("preview")
@url_option
@schedule_argument
@click.option("-n", default=5, show_default=True)
def schedules_preview(url: str, schedule: str, n: int) -> None:
    """The next N fire times."""
    with connect(url) as client:
        found = find_schedule(client, schedule)
        times = client.schedules("GET", f"/{found['id']}/preview", params={"n": n})["next"]
    for time_ in times:
        click.echo(local_time(time_, found["timezone"]))


@schedules.command("runs")
@url_option
@schedule_argument
def schedules_runs(url: str, schedule: str) -> None:
    """Past runs with their batch's status."""
    with connect(url) as client:
        found = find_schedule(client, schedule)
        data = client.schedules("GET", f"/{found['id']}/runs")["data"]
    table(
        ("FIRE TIME", "TRIGGER", "BATCH", "STATUS", "ERROR"),
        [
            (
                local_time(r["fire_time"], found["timezone"]),
                r["trigger"],
                r["batch_id"] or "",
                r["batch_status"] or "",
                r["error"] or "",
            )
            for r in data
        ],
        empty=f"{_named(found)} has not run yet",
    )


@schedules.command("run")
@url_option
@schedule_argument
@click.option("--follow", is_flag=True, help="draw the batch's progress until it ends")
def schedules_run(url: str, schedule: str, follow: bool) -> None:
    """Start the schedule's batch now; prints the batch's id."""
    from gpuq.cli.batches import follow as follow_batch
    from gpuq.cli.batches import summary

    with connect(url) as client:
        found = find_schedule(client, schedule)
        run = client.schedules("POST", f"/{found['id']}/run")
        if not run["batch_id"]:
            stop(f"{_named(found)} did not start a batch: {run['error'] or 'no reason given'}")
        click.echo(
            f"{_named(found)}: started batch {run['batch_id']}; "
            f"`gpuq batch status {run['batch_id']} --follow` shows its progress",
            err=True,
        )
        click.echo(run["batch_id"])
        if follow:
            click.echo(summary(follow_batch(client, run["batch_id"])), err=True)


def _schedule_action(action: str, done: str, help_: str) -> None:
    @schedules.command(action, help=help_)
    @url_option
    @schedule_argument
    def command(url: str, schedule: str) -> None:
        with connect(url) as client:
            found = find_schedule(client, schedule)
            changed = client.schedules("POST", f"/{found['id']}/{action}")
        next_run = local_time(changed["next_fire_at"], changed["timezone"])
        click.echo(f"{done} {_named(found)}" + (f"; next run {next_run}" if changed["enabled"] else ""))


_schedule_action("pause", "paused", "Pause a schedule: it fires no more until resumed.")
_schedule_action("resume", "resumed", "Resume a schedule (it does not fire for the ticks it missed while paused).")


@schedules.command("delete")
@url_option
@schedule_argument
def schedules_delete(url: str, schedule: str) -> None:
    """Delete a schedule (its past runs' batches stay)."""
    with connect(url) as client:
        found = find_schedule(client, schedule)
        client.schedules("DELETE", f"/{found['id']}")
    click.echo(f"deleted {_named(found)}")
