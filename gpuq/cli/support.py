"""What the `gpuq` client commands share: the --url option, a client holding the key
whose refusals end the command as one line, and plain tables."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import NoReturn

import click
import httpx

from gpuq.cli.client import DEFAULT_URL, ApiError, GpuqClient

url_option = click.option(
    "--url", envvar="GPUQ_API_URL", default=DEFAULT_URL, show_default=True, help="gpuq API address"
)


@contextmanager
def connect(url: str) -> Iterator[GpuqClient]:
    """A client sending GPUQ_API_KEY, or the admin key `gpuq up` saved in the data directory.
    An API refusal, or an API that cannot be reached, ends the command with one line on stderr."""
    from gpuq.auth.admin_key import cli_api_key
    from gpuq.settings import get_settings

    client = GpuqClient(url, api_key=cli_api_key(get_settings()))
    try:
        yield client
    except ApiError as exc:
        fail(exc)
    except httpx.TransportError as exc:
        # A stopped server or a wrong --url is the common case; a traceback would hide it.
        click.echo(
            f"error: cannot reach the gpuq API at {url} ({exc or type(exc).__name__}); "
            "is `gpuq up` running, and is --url / GPUQ_API_URL right?",
            err=True,
        )
        sys.exit(2)
    finally:
        client.close()


def fail(exc: ApiError) -> NoReturn:
    """An API refusal: its reason on stderr, exit status 1."""
    click.echo(f"error: {exc.detail} (HTTP {exc.status})", err=True)
    sys.exit(1)


def table(headers: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    for row in (headers, *rows):
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
