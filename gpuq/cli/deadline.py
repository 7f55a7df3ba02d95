"""``--deadline``: when a job is needed by, as a time or as a duration from now.

The API takes an ISO 8601 time with a time zone (``deadline`` on ``POST /v1/jobs``,
``X-Gpuq-Deadline`` on the drop-in routes). People at a terminal think "in half an hour", so
the option also takes ``90s``, ``30m``, ``2h``, ``1d`` or a sum such as ``1h30m``, made a time
here, when the command starts. Either must lie ahead: a mistake is a usage error (one line,
exit 2) before anything is sent. A time without a zone is refused rather than read as local
or as UTC, as the API refuses it: the two guesses differ by hours.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import click

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(?:(\d+)([smhd]))+")
_PART = re.compile(r"(\d+)([smhd])")
EXAMPLES = "e.g. 30m, 2h, 1h30m, or 2026-12-07T18:00:00Z"


def parse_deadline(text: str, *, now: datetime | None = None) -> datetime:
    """The moment ``text`` names: a duration from ``now`` or an ISO 8601 time with a zone.
    ValueError says what is wrong, in words for the user."""
    now = now or datetime.now(UTC)
    given = text.strip().lower()
    if _DURATION.fullmatch(given):
        seconds = sum(int(n) * _UNITS[unit] for n, unit in _PART.findall(given))
        if seconds == 0:
            raise ValueError(f"{text!r} is no time from now: give a duration above zero ({EXAMPLES})")
        return now + timedelta(seconds=seconds)
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is neither a duration nor an ISO 8601 time ({EXAMPLES})") from None
    if moment.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone: add one, e.g. {text.strip()}Z for UTC or {text.strip()}+01:00")
    if moment <= now:
        raise ValueError(f"{text!r} has passed: give a time in the future, or a duration ({EXAMPLES})")
    return moment


class Deadline(click.ParamType):
    """A click type: the option's value as an aware datetime."""

    name = "deadline"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> datetime:
        if isinstance(value, datetime):
            return value
        try:
            return parse_deadline(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


deadline_option = click.option(
    "--deadline",
    type=Deadline(),
    default=None,
    help=f"when the job is needed by: a duration from now or an ISO 8601 time with a zone ({EXAMPLES}); "
    "the API refuses it at once if the fleet cannot make it",
)


def shown(iso: str | None, status: str, *, now: datetime | None = None) -> str:
    """A job's deadline as the API returns it, said to be past when the job still waits."""
    if not iso:
        return ""
    moment = datetime.fromisoformat(iso)
    if moment.tzinfo is None:  # as SQLite hands it back: gpuq stores UTC
        moment = moment.replace(tzinfo=UTC)
    text = moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    if status == "queued" and moment <= (now or datetime.now(UTC)):
        return f"{text} (passed, still queued)"
    return text
