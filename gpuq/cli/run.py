"""``gpuq run MODEL [PROMPT]``: chat with a model as ``ollama run`` does, through the queue.

Each answer is an ordinary job (high priority unless told otherwise), rendered with the
model's chat template and streamed token by token as its worker samples them. With a
PROMPT (or text on stdin) it answers once; on a terminal without one it keeps a
conversation going (``/bye`` or Ctrl-D ends it). Ctrl-C while an answer streams cancels
its job and, in a conversation, returns to the prompt.
"""

from __future__ import annotations

import sys
from datetime import datetime
from typing import Any, NamedTuple

import click

from gpuq.cli.client import GpuqClient
from gpuq.cli.deadline import deadline_option
from gpuq.cli.support import connect, url_option

EXIT_INTERRUPTED = 130


@click.command()
@url_option
@click.argument("model")
@click.argument("prompt", nargs=-1)
@click.option("--system", default=None, help="a system message before the conversation")
@click.option("--max-tokens", type=click.IntRange(min=1), default=None, help="default: what the context leaves")
@click.option("--temperature", type=click.FloatRange(0, 2), default=0.8, show_default=True)
@click.option("--seed", type=int, default=None)
@click.option(
    "--priority", type=click.Choice(["high", "normal", "low"]), default=None, help="default: the key's, else high"
)
@deadline_option
def run(
    url: str,
    model: str,
    prompt: tuple[str, ...],
    system: str | None,
    max_tokens: int | None,
    temperature: float,
    seed: int | None,
    priority: str | None,
    deadline: datetime | None,
) -> None:
    """Chat with MODEL: answer PROMPT (or stdin), or talk on the terminal. A --deadline holds
    for every answer of a conversation: one asked after it is refused."""
    messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    sampling: dict[str, Any] = {"model": model, "temperature": temperature, "seed": seed, "max_tokens": max_tokens}
    sampling = {k: v for k, v in sampling.items() if v is not None}
    text = " ".join(prompt) or (sys.stdin.read().strip() if not sys.stdin.isatty() else "")
    headers = _Headers(priority, deadline)
    with connect(url) as client:
        if text:
            if _answer(client, sampling, [*messages, {"role": "user", "content": text}], headers) is None:
                sys.exit(EXIT_INTERRUPTED)
            return
        _converse(client, sampling, messages, headers)


class _Headers(NamedTuple):
    """What each answer's request says besides its body: gpuq's X-Gpuq-* headers."""

    priority: str | None
    deadline: datetime | None


def _converse(client: GpuqClient, sampling: dict[str, Any], messages: list[dict[str, str]], headers: _Headers) -> None:
    click.echo("Send a message (/bye or Ctrl-D to end; Ctrl-C stops an answer).", err=True)
    while True:
        try:
            line = input(">>> ")
        except EOFError:
            click.echo(err=True)
            return
        except KeyboardInterrupt:
            click.echo("\nUse Ctrl-D or /bye to end.", err=True)
            continue
        if line.strip() in ("/bye", "/exit"):
            return
        if not line.strip():
            continue
        asked = [*messages, {"role": "user", "content": line}]
        answer = _answer(client, sampling, asked, headers)
        if answer is not None:  # an answer stopped by Ctrl-C is not part of the conversation
            messages = [*asked, {"role": "assistant", "content": answer}]


def _answer(
    client: GpuqClient, sampling: dict[str, Any], messages: list[dict[str, str]], headers: _Headers
) -> str | None:
    """Streams one answer to stdout; None if Ctrl-C stopped it (its job is then cancelled)."""
    pieces: list[str] = []
    job_id = ""
    try:
        body = sampling | {"messages": messages}
        with client.stream_chat(body, priority=headers.priority, deadline=headers.deadline) as stream:
            job_id = stream.job_id
            for piece in stream:
                pieces.append(piece)
                click.echo(piece, nl=False)
        click.echo()
        if stream.finish_reason == "length":
            click.echo("(the answer reached --max-tokens or the model's context)", err=True)
        return "".join(pieces)
    except KeyboardInterrupt:
        # Closing the stream already tells gpuq; the explicit cancel says so even if the
        # connection lingers, and tells the user what became of the job.
        click.echo(err=True)
        if job_id:
            _cancel_quietly(client, job_id)
        return None


def _cancel_quietly(client: GpuqClient, job_id: str) -> None:
    from gpuq.cli.client import ApiError

    try:
        job = client.cancel(job_id)
    except ApiError:  # it had just finished, or closing the stream cancelled it first
        try:
            job = client.job(job_id)
        except ApiError:
            job = {"status": "unknown"}
        if job["status"] != "cancelled":
            click.echo(f"stopped; job {job_id} had already ended ({job['status']})", err=True)
            return
    # A running job's cancel is a request its worker acts on at the next token: "(running)" read
    # as if the cancel had not worked.
    stopping = " (it was running; its worker stops it now)" if job["status"] == "running" else ""
    click.echo(f"cancelled job {job_id}{stopping}", err=True)
