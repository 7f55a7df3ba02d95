"""``gpuq gpus``: the fleet's GPUs, every host's, as the API knows them (the inventory the
supervisors record in SQL and the telemetry they publish to Redis); ``--local`` shows this
host's GPUs as a supervisor started here would discover them, without the API."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click

from gpuq.cli.support import connect, table, url_option

HEADERS = ("HOST", "INDEX", "UUID", "NAME", "MEMORY", "FREE", "UTIL", "TEMP", "POWER", "STATE")


@click.command()
@url_option
@click.option("--local", is_flag=True, help="this host's GPUs (NVML or GPUQ_SIMULATED_GPUS), without the API")
def gpus(url: str, local: bool) -> None:
    """The GPUs of the whole fleet: memory, utilisation, temperature, power and health."""
    if local:
        _local_gpus()
        return
    with connect(url) as client:
        fleet = client.gpus()
    if not fleet:
        click.echo("no GPU in the fleet: no supervisor has recorded one (workers without GPUs run on the CPU)")
        return
    fleet.sort(key=lambda g: (g["host"], g["index"]))
    table(HEADERS, [_row(g) for g in fleet])
    hosts = len({g["host"] for g in fleet})
    silent = sum(not g["live"] for g in fleet)
    unhealthy = sum(not g["healthy"] for g in fleet)
    click.echo(f"{len(fleet)} GPU(s) on {hosts} host(s); {silent} silent, {unhealthy} unhealthy")


def _row(gpu: dict[str, Any]) -> tuple[str, ...]:
    return (
        gpu["host"],
        str(gpu["index"]),
        gpu["uuid"],
        gpu["name"],
        f"{gpu['memory_total_mib']} MiB",
        _maybe(gpu["memory_free_mib"], " MiB"),
        _maybe(gpu["utilisation_pct"], "%"),
        _maybe(gpu["temperature_c"], " C"),
        _maybe(gpu["power_w"], " W"),
        _state(gpu),
    )


def _state(gpu: dict[str, Any]) -> str:
    if not gpu["healthy"]:
        return f"unhealthy: {gpu['unhealthy_reason'] or 'no reason recorded'}"
    if gpu["live"]:
        return "live"
    seen = datetime.fromisoformat(gpu["last_seen"])
    minutes = (datetime.now(UTC) - seen).total_seconds() / 60
    return f"silent (no telemetry; last recorded {minutes:.0f} min ago)"


def _local_gpus() -> None:
    from gpuq.fleet.gpus import discover_gpus
    from gpuq.settings import get_settings

    settings = get_settings()
    inventory = discover_gpus(simulated=settings.simulated_gpus, host=settings.host_label)
    if not inventory.gpus and not inventory.unreadable:
        click.echo(f"{inventory.host}: no GPU found (NVML unavailable); workers run on the CPU")
        return
    click.echo(f"{inventory.host}: {len(inventory.gpus)} GPU(s) from {inventory.source}")
    table(
        ("INDEX", "UUID", "NAME", "MEMORY", "FREE", "UTIL", "TEMP", "POWER", "CC"),
        [
            (
                g.slot_name.removeprefix("gpu"),  # 0, or 0-mig1 for a MIG device
                g.uuid,
                g.name,
                f"{g.memory_total_mib} MiB",
                f"{g.memory_free_mib} MiB",
                _maybe(g.utilisation_pct, "%"),
                _maybe(g.temperature_c, " C"),
                _maybe(g.power_w, " W"),
                g.compute_capability or "",
            )
            for g in inventory.gpus
        ],
    )
    for lost in inventory.unreadable:
        click.echo(f"GPU {lost.index} ({lost.uuid or 'UUID unknown'}): unusable, {lost.error}; it gets no worker")


def _maybe(value: float | int | None, unit: str) -> str:
    return "" if value is None else f"{value:g}{unit}"


COMMANDS = (gpus,)
