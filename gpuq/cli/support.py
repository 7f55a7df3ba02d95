"""What the `gpuq` client commands share: the --url option (and the address `gpuq up`
remembers for it), a client holding the key, and plain tables. How a command ends when
something fails is in errors.py."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import click
import httpx
from click.core import ParameterSource

from gpuq.cli.client import DEFAULT_URL, ApiError, GpuqClient
from gpuq.cli.errors import CommandFailed, unreachable


def url_file(data_dir: Path) -> Path:
    """Where `gpuq up` writes the address it serves on, for the next CLI command."""
    return data_dir / "api.url"


def remember_url(data_dir: Path, host: str, port: int) -> None:
    """Written by `gpuq up` once it listens: a client on this machine reaches a wildcard
    address through loopback."""
    from gpuq.private_files import private_dir, write_private

    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    shown = f"[{host}]" if ":" in host else host
    write_private(url_file(private_dir(data_dir)), f"http://{shown}:{port}\n".encode())


def default_url() -> tuple[str, str]:
    """The address a command calls without --url, and where it comes from: GPUQ_API_URL,
    else what `gpuq up` saved in the data directory, else 127.0.0.1:8000."""
    if os.environ.get("GPUQ_API_URL"):
        return os.environ["GPUQ_API_URL"], "from GPUQ_API_URL"
    from gpuq.settings import get_settings

    try:
        path = url_file(get_settings().data_dir)
        saved = path.read_text().strip() if path.is_file() else ""
    except Exception:  # settings that do not load, an unreadable file: the command says so later
        saved = ""
    return (saved, f"saved by `gpuq up` in {path}") if saved else (DEFAULT_URL, "default")


class _UrlOption(click.Option):
    """--url, whose help shows the address a command would call now and why."""

    def get_help_extra(self, ctx: click.Context) -> click.types.OptionHelpExtra:
        url, source = default_url()
        return {**super().get_help_extra(ctx), "default": f"{url}, {source}"}


def _url_or_the_root_one(ctx: click.Context, param: click.Parameter, value: str | None) -> str:
    # `gpuq --url X jobs` as well as `gpuq jobs --url X`: a --url given after the command
    # wins, then one given before it, then GPUQ_API_URL, then what `gpuq up` saved, then the default.
    if ctx.get_parameter_source(param.name or "url") in (ParameterSource.DEFAULT, ParameterSource.ENVIRONMENT):
        given_first = ctx.find_root().params.get("url")
        if given_first:
            return str(given_first)
    return value or default_url()[0]


url_option = click.option(
    "--url",
    cls=_UrlOption,
    envvar="GPUQ_API_URL",
    default=None,
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
