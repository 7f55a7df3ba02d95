"""What the `gpuq` client commands share: the --url option, a client holding the key, and
plain tables. How a command ends when something fails is in errors.py."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import click
import httpx
from click.core import ParameterSource

from gpuq.cli.client import DEFAULT_URL, ApiError, GpuqClient
from gpuq.cli.errors import CommandFailed, unreachable


def _url_or_the_root_one(ctx: click.Context, param: click.Parameter, value: str) -> str:
    # `gpuq --url X jobs` as well as `gpuq jobs --url X`: a --url given after the command
    # wins, then one given before it, then GPUQ_API_URL, then the default.
    if ctx.get_parameter_source(param.name or "url") in (ParameterSource.DEFAULT, ParameterSource.ENVIRONMENT):
        given_first = ctx.find_root().params.get("url")
        if given_first:
            return str(given_first)
    return value


url_option = click.option(
    "--url",
    envvar="GPUQ_API_URL",
    default=DEFAULT_URL,
    show_default=True,
    callback=_url_or_the_root_one,
    help="gpuq API address (may also come before the command)",
)


@contextmanager
def connect(url: str) -> Iterator[GpuqClient]:
    """A client sending GPUQ_API_KEY, or the admin key `gpuq up` saved in the data directory.
    An API that cannot be reached, or a refusal for want of a key, ends the command with a line
    that says where to look; other refusals end it as every failure does (errors.py)."""
    from gpuq.auth.admin_key import cli_api_key, key_file
    from gpuq.settings import get_settings

    settings = get_settings()
    api_key = cli_api_key(settings)
    client = GpuqClient(url, api_key=api_key)
    try:
        yield client
    except ApiError as exc:
        if exc.status == 401 and api_key is None:
            raise CommandFailed(
                f"no API key: set GPUQ_API_KEY, or run this where `gpuq up` saved its admin key "
                f"({key_file(settings.data_dir).resolve()} does not exist)"
            ) from None
        raise  # any other refusal: its detail and status, as errors.py words it
    except httpx.TransportError as exc:
        raise unreachable(url, exc) from None
    finally:
        client.close()


def table(headers: tuple[str, ...], rows: Sequence[tuple[str, ...]], *, empty: str = "none") -> None:
    """Rows under their headers in aligned columns; with no rows, ``empty`` says so instead
    (on stderr, as kubectl's "No resources found", so that stdout stays empty for scripts)."""
    if not rows:
        click.echo(empty, err=True)
        return
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    for row in (headers, *rows):
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def duration(ms: float | None) -> str:
    """Milliseconds as people read them: ``850 ms``, ``1.2 s``, ``14 s``, ``3.5 min``, ``2 h``."""
    if ms is None:
        return ""
    if ms < 1000:
        return f"{ms:.0f} ms"
    seconds = ms / 1000
    value, unit = (seconds, "s") if seconds < 60 else (seconds / 60, "min") if seconds < 3600 else (seconds / 3600, "h")
    return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
