"""How a `gpuq` command ends when it cannot do what was asked: one line on stderr, starting
with ``error:``, and a non-zero exit status; never a traceback.

``GpuqGroup`` is the root group's class, so every command gets this, including commands added
later: a refusal from the API (exit 1), an API that cannot be reached (2), a usage mistake
(2, with where the command's help is), a database that is missing or not migrated, a file
that cannot be read, a bad setting. Anything else (most likely gpuq's own bug) is one line
too, naming the exception, and ``gpuq -v ...`` lets its traceback through."""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import click
import httpx

from gpuq.cli.client import ApiError

EXIT_FAILED = 1
EXIT_UNREACHABLE = 2  # as click's usage errors


# Click 8.2 raises this for a group called without a command; 8.1 printed the help itself.
NO_ARGS_IS_HELP: type[click.UsageError] | tuple[()] = getattr(click.exceptions, "NoArgsIsHelpError", ())


class CommandFailed(click.ClickException):
    """A failure already worded for the user: shown as ``error: <message>``, exit status 1."""

    exit_code = EXIT_FAILED


class Unreachable(CommandFailed):
    exit_code = EXIT_UNREACHABLE


def stop(message: str) -> NoReturn:
    """End the command with ``error: <message>`` on stderr."""
    raise CommandFailed(message)


def unreachable(url: str, exc: Exception) -> Unreachable:
    # A stopped server or a wrong --url is the common case.
    return Unreachable(
        f"cannot reach the gpuq API at {url} ({exc or type(exc).__name__}); "
        "is `gpuq up` running, and is --url / GPUQ_API_URL right?"
    )


def describe(exc: Exception) -> CommandFailed | None:
    """The one line a known kind of failure is told in, or None for a bug."""
    if isinstance(exc, ApiError):
        # A refusal that says when to try again (a deadline the fleet cannot make, a limit)
        # carries its Retry-After in the same line: a script can read it without the body.
        retry = f", Retry-After: {exc.retry_after} s" if exc.retry_after is not None else ""
        return CommandFailed(f"{exc.detail} (HTTP {exc.status}{retry})")
    if isinstance(exc, httpx.TransportError):
        try:
            url = str(exc.request.url.copy_with(path="/", query=None)).rstrip("/")
        except RuntimeError:  # no request attached
            url = "the configured address"
        return unreachable(url, exc)
    if isinstance(exc, TimeoutError) and str(exc):
        return CommandFailed(str(exc))
    if isinstance(exc, OSError) and exc.strerror:
        return CommandFailed(f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror)
    from gpuq.local.data_lock import DataDirInUse

    if isinstance(exc, DataDirInUse):
        return CommandFailed(str(exc))
    return _settings_error(exc) or _database_error(exc)


def _settings_error(exc: Exception) -> CommandFailed | None:
    from pydantic import ValidationError

    from gpuq.settings import ENV_PREFIX, Settings, UnknownSettingError

    if isinstance(exc, UnknownSettingError):
        return CommandFailed(str(exc))
    if not isinstance(exc, ValidationError) or exc.title != Settings.__name__:
        return None
    problems = [f"{ENV_PREFIX}{'_'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in exc.errors()]
    return CommandFailed(f"bad setting: {'; '.join(problems)}")


def _database_error(exc: Exception) -> CommandFailed | None:
    from sqlalchemy.exc import DBAPIError

    if not isinstance(exc, DBAPIError):
        return None
    reason = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else type(exc).__name__
    return CommandFailed(f"database error: {reason} (is GPUQ_DATABASE_URL right, and has `gpuq db upgrade` run?)")


def _usage_line(exc: click.UsageError) -> str:
    where = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
    return f"error: {exc.format_message()}{where}"


class GpuqGroup(click.Group):
    """The root group: runs a command and ends every failure of it in one line."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:
            failed = describe(exc)
            if ctx.params.get("verbose"):
                raise
            if failed is None:
                failed = CommandFailed(f"{type(exc).__name__}: {exc} (`gpuq -v ...` shows the traceback)")
            raise failed from exc

    def main(self, *args: Any, **extra: Any) -> NoReturn:
        # Click's standalone mode would print usage errors in four lines and let other
        # exceptions through; this one prints each failure in one line, then exits.
        extra["standalone_mode"] = False
        try:
            result = super().main(*args, **extra)
        except NO_ARGS_IS_HELP as exc:  # `gpuq rules` alone: its help, as click prints it
            click.echo(exc.format_message())
            sys.exit(exc.exit_code)
        except click.UsageError as exc:
            click.echo(_usage_line(exc), err=True)
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            click.echo("aborted", err=True)
            sys.exit(EXIT_FAILED)
        except click.ClickException as exc:
            click.echo(f"error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        sys.exit(result if isinstance(result, int) else 0)
