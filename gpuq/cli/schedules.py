"""`gpuq schedules`: cron schedules of batch runs, through the API."""

from __future__ import annotations

import click

from gpuq.cli.support import connect, table, url_option


@click.group()
def schedules() -> None:
    """Cron schedules of batch runs."""


@schedules.command("list")
@url_option
def schedules_list(url: str) -> None:
    with connect(url) as client:
        data = client.schedules()["data"]
    table(
        ("ID", "NAME", "CRON", "TZ", "ENABLED", "MISFIRE", "NEXT"),
        [
            (
                str(s["id"]),
                s["name"],
                s["cron"],
                s["timezone"],
                "yes" if s["enabled"] else "paused",
                s["misfire"],
                s["next_fire_at"],
            )
            for s in data
        ],
    )


@schedules.command("add")
@url_option
@click.argument("name")
@click.argument("cron")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--timezone", default="UTC", show_default=True)
@click.option("--misfire", type=click.Choice(["skip", "run_once"]), default="skip", show_default=True)
@click.option("--priority", default="low", show_default=True)
def schedules_add(url: str, name: str, cron: str, path: str, timezone: str, misfire: str, priority: str) -> None:
    """Run the batch file PATH on CRON (e.g. '0 2 * * *'); the file is uploaded once."""
    from gpuq.cli.batches import first_endpoint

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
            },
        )
    click.echo(f"schedule {created['id']} {name}: next run {created['next_fire_at']}")


@schedules.command("preview")
@url_option
@click.argument("schedule_id", type=int)
@click.option("-n", default=5, show_default=True)
def schedules_preview(url: str, schedule_id: int, n: int) -> None:
    """The next N fire times."""
    with connect(url) as client:
        for time_ in client.schedules("GET", f"/{schedule_id}/preview", params={"n": n})["next"]:
            click.echo(time_)


@schedules.command("runs")
@url_option
@click.argument("schedule_id", type=int)
def schedules_runs(url: str, schedule_id: int) -> None:
    """Past runs with their batch's status."""
    with connect(url) as client:
        data = client.schedules("GET", f"/{schedule_id}/runs")["data"]
    table(
        ("FIRE TIME", "TRIGGER", "BATCH", "STATUS", "ERROR"),
        [(r["fire_time"], r["trigger"], r["batch_id"] or "", r["batch_status"] or "", r["error"] or "") for r in data],
    )


def _schedule_action(action: str, method: str = "POST") -> None:
    @schedules.command(action, help=f"{action.capitalize()} a schedule.")
    @url_option
    @click.argument("schedule_id", type=int)
    def command(url: str, schedule_id: int) -> None:
        with connect(url) as client:
            client.schedules(method, f"/{schedule_id}" + ("" if method == "DELETE" else f"/{action}"))
        click.echo(f"schedule {schedule_id}: {action} done")


for _action in ("pause", "resume", "run"):
    _schedule_action(_action)
_schedule_action("delete", "DELETE")
