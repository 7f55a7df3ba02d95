"""`gpuq rules`: affinity rules (where models may run), through the API."""

from __future__ import annotations

from typing import Any

import click

from gpuq.cli.support import connect, table, url_option


@click.group()
def rules() -> None:
    """Affinity rules: which GPUs a model may run on."""


@rules.command("list")
@url_option
def rules_list(url: str) -> None:
    """The rules, in precedence order."""
    with connect(url) as client:
        data = client.rules()
    table(
        ("ID", "PREC", "EFFECT", "MODEL", "KIND", "SELECTOR"),
        [
            (str(r["id"]), str(r["precedence"]), r["effect"], r["model_pattern"], r["kind"] or "*", _selector(r))
            for r in data
        ],
        empty="no affinity rules: every model may run on every GPU it fits",
    )


def _selector(rule: dict[str, Any]) -> str:
    parts = [
        f"{key}={','.join(map(str, value)) if isinstance(value, list) else value}"
        for key in ("gpu_indices", "gpu_uuids", "gpu_name_pattern", "host_pattern", "min_memory_mib")
        if (value := rule.get(key)) is not None
    ]
    return " ".join(parts) or "all GPUs"


def _gpu_indices(_ctx: click.Context, _param: click.Parameter, value: str | None) -> list[int] | None:
    """``0,1``, ``0-3`` or ``0-1,4`` as a sorted list of GPU indices; anything else a usage error."""
    if value is None:
        return None
    indices: set[int] = set()
    for part in (p.strip() for p in value.split(",")):
        first, dash, last = part.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise click.BadParameter(f"{part!r} is not a GPU index or a range of them (e.g. 0,1 or 0-3)")
        low, high = int(first), int(last) if dash else int(first)
        if high < low:
            raise click.BadParameter(f"{part!r}: a range goes up, e.g. {high}-{low}")
        indices.update(range(low, high + 1))
    return sorted(indices)


@rules.command("add")
@url_option
@click.option("--model", "model_pattern", required=True, help="glob over model names")
@click.option("--kind", type=click.Choice(["generate", "embed"]), default=None)
@click.option("--deny", is_flag=True, help="deny instead of allow")
@click.option("--gpus", "gpu_indices", default=None, callback=_gpu_indices, help="GPU indices, e.g. 0,1 or 0-3")
@click.option("--uuids", "gpu_uuids", default=None, help="GPU UUIDs, comma-separated")
@click.option("--name", "gpu_name_pattern", default=None, help="glob over GPU names, e.g. '*H100*'")
@click.option("--host", "host_pattern", default=None, help="glob over host names")
@click.option("--min-memory-mib", type=int, default=None)
@click.option("--precedence", type=int, default=0, show_default=True)
def rules_add(
    url: str,
    model_pattern: str,
    kind: str | None,
    deny: bool,
    gpu_indices: list[int] | None,
    gpu_uuids: str | None,
    gpu_name_pattern: str | None,
    host_pattern: str | None,
    min_memory_mib: int | None,
    precedence: int,
) -> None:
    """Add a rule: the GPUs a model may run on (or, with --deny, may not).

    For example `gpuq rules add --model 'llama-*' --gpus 0-1`."""
    body = {
        "model_pattern": model_pattern,
        "kind": kind,
        "effect": "deny" if deny else "allow",
        "precedence": precedence,
        "gpu_name_pattern": gpu_name_pattern,
        "host_pattern": host_pattern,
        "min_memory_mib": min_memory_mib,
        "gpu_indices": gpu_indices,
        "gpu_uuids": gpu_uuids.split(",") if gpu_uuids else None,
    }
    with connect(url) as client:
        saved = client.add_rule(body)
    click.echo(f"rule {saved['rule']['id']} saved")
    for warning in saved["warnings"]:
        click.echo(f"warning: {warning}", err=True)


@rules.command("delete")
@url_option
@click.argument("rule_id", type=int)
def rules_delete(url: str, rule_id: int) -> None:
    """Delete a rule; says which rule it was."""
    with connect(url) as client:
        rule = next((r for r in client.rules() if r["id"] == rule_id), None)
        client.delete_rule(rule_id)  # a rule missing from the list is the API's 404 to tell
    click.echo(f"deleted rule {rule_id}" + (f": {_describe(rule)}" if rule else ""))


def _describe(rule: dict[str, Any]) -> str:
    kind = f" {rule['kind']}" if rule["kind"] else ""
    return f"{rule['effect']} {rule['model_pattern']}{kind} on {_selector(rule)}"


@rules.command("preview")
@url_option
@click.argument("model")
@click.option("--kind", type=click.Choice(["generate", "embed"]), default="generate", show_default=True)
def rules_preview(url: str, model: str, kind: str) -> None:
    """Where may MODEL run, and why."""
    with connect(url) as client:
        result = client.preview(model, kind)
    click.echo(f"{result['summary']} (needs {result['vram_mib']} MiB)")
    table(
        ("HOST", "GPU", "NAME", "MAY RUN", "WHY"),
        [
            (g["host"], str(g["index"]), g["name"], "yes" if g["may_run"] else "no", "; ".join(g["reasons"]))
            for g in result["gpus"]
        ],
        empty="no GPUs registered: jobs run on CPU workers",
    )
