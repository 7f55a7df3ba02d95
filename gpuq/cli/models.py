"""``gpuq models``: the registered models, and registering one."""

from __future__ import annotations

import os

import click

from gpuq.cli.support import connect, table, url_option


@click.group(invoke_without_command=True)
@url_option
@click.pass_context
def models(ctx: click.Context, url: str) -> None:
    """List registered models and their aliases (or `models register`, `models alias`)."""
    ctx.obj = url
    if ctx.invoked_subcommand is not None:
        return
    with connect(url) as client:
        data = client.models()
    table(
        ("NAME", "KINDS", "CONTEXT", "SIZE", "PATH"),
        [
            (
                m["id"] if m.get("alias_of") is None else f"{m['id']} -> {m['alias_of']}",
                ",".join(m["kinds"]),
                str(m["context_length"]),
                f"{m['size_bytes'] / 2**20:.0f} MiB",
                m["path"],
            )
            for m in data
        ],
        empty="no models registered (`gpuq models register NAME PATH` adds one)",
    )


@models.command("register")
@click.argument("name")
@click.argument("path")
@click.option("--kind", "kinds", multiple=True, type=click.Choice(["generate", "embed"]), default=["generate"])
@click.option("--context-length", type=int, default=None)
@click.pass_obj
def models_register(url: str, name: str, path: str, kinds: tuple[str, ...], context_length: int | None) -> None:
    """Register NAME for the GGUF file PATH: a file this directory has (`models/x.gguf`), or
    a path relative to the API's models directory (GPUQ_MODELS_DIR); it must be inside that."""
    with connect(url) as client:
        model = client.register_model(
            {"name": name, "path": _as_the_api_reads_it(path), "kinds": list(kinds), "context_length": context_length}
        )
    click.echo(f"registered {model['id']} ({', '.join(model['kinds'])}, context {model['context_length']})")


@models.command("alias")
@click.argument("alias")
@click.argument("model")
@click.pass_obj
def models_alias(url: str, alias: str, model: str) -> None:
    """Let clients name MODEL as ALIAS (a name a client insists on, such as
    `text-embedding-3-small`): jobs sent under ALIAS run as MODEL's own."""
    with connect(url) as client:
        made = client.set_alias(alias, model)
    click.echo(f"{made['alias']} -> {made['model']}")


@models.command("unalias")
@click.argument("alias")
@click.pass_obj
def models_unalias(url: str, alias: str) -> None:
    """Remove the alias ALIAS (the model stays registered)."""
    with connect(url) as client:
        client.delete_alias(alias)
    click.echo(f"removed alias {alias}")


def _as_the_api_reads_it(path: str) -> str:
    """A relative path that names a file here is sent whole (absolute): the API would read it
    inside its models directory (`models/x.gguf` as `models/models/x.gguf`). Any other path
    goes as written, for the API to read inside its models directory."""
    return os.path.abspath(path) if not os.path.isabs(path) and os.path.isfile(path) else path
