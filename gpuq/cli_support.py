"""What the `gpuq` client commands share: the --url option, a client holding the key,
API refusals printed as one line, and plain tables."""

from __future__ import annotations

import sys
from typing import NoReturn

import click

from gpuq.client import DEFAULT_URL, ApiError, GpuqClient

url_option = click.option(
    "--url", envvar="GPUQ_API_URL", default=DEFAULT_URL, show_default=True, help="gpuq API address"
)


def connect(url: str) -> GpuqClient:
    """A client sending GPUQ_API_KEY, or the admin key `gpuq up` saved in the data directory."""
    from gpuq.admin_key import cli_api_key
    from gpuq.settings import get_settings

    return GpuqClient(url, api_key=cli_api_key(get_settings()))


def fail(exc: ApiError) -> NoReturn:
    """An API refusal: its reason on stderr, exit status 1."""
    click.echo(f"error: {exc.detail} (HTTP {exc.status})", err=True)
    sys.exit(1)


def table(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    for row in (headers, *rows):
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
