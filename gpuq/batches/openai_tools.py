"""OpenAI's function tools as gpuq job requests hold them: ``tools`` and ``tool_choice`` in
(chat completions, batch lines and the Responses API), tool call ids out."""

from __future__ import annotations

import json
from typing import Any

from gpuq.errors import RequestError
from gpuq.jobs import tool_calls
from gpuq.jobs.constraint import enforceable


def tool_fields(tools: list[dict[str, Any]] | None, choice: Any, *, parallel: bool = True) -> dict[str, Any]:
    """OpenAI's ``tools`` and ``tool_choice`` as a job's request stores them: ``none`` leaves
    the tools out (the template does not offer them, the reply is not read for calls);
    ``required`` and a named function are enforced while sampling (a 400 naming the keyword
    a function's parameters use that the engine cannot enforce); not ``parallel``: at most
    one call is read from the reply (gpuq/jobs/tool_calls.py)."""
    if isinstance(choice, dict) and choice.get("type") == "function" and "function" not in choice:
        choice = {"type": "function", "function": {"name": choice.get("name")}}  # the Responses API's spelling
    named = isinstance(choice, dict) and isinstance(tool_calls.function(choice).get("name"), str)
    if choice not in (None, "none", "auto", "required") and not named:
        raise RequestError(
            400, 'tool_choice: none, auto, required or {"type": "function", "function": {"name": ...}}',
            param="tool_choice",
        )  # fmt: skip
    if not tools or choice == "none":
        if choice not in (None, "none", "auto"):
            raise RequestError(400, "tool_choice requires a function but no tools are given", param="tool_choice")
        return {}
    _check_functions(tools)
    fields: dict[str, Any] = {"tools": tools}
    if not parallel:
        fields["parallel_tool_calls"] = False
    if choice not in (None, "auto"):
        fields["tool_choice"] = choice
        wanted = tool_calls.function(choice).get("name") if isinstance(choice, dict) else None
        if wanted is not None and wanted not in tool_calls.names(tools):
            raise RequestError(400, f"tool_choice names {wanted!r}, which is not one of tools", param="tool_choice")
        forced = tool_calls.forced_schema(tools, choice)
        if forced is not None:
            enforceable(forced, "tools")
    return fields


def _check_functions(tools: list[dict[str, Any]]) -> None:
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or tool.get("type", "function") != "function" or not fn.get("name"):
            raise RequestError(
                400, f'tools[{i}] is not a function tool ({{"type": "function", "function": {{"name": ...}}}})',
                param=f"tools[{i}]",
            )  # fmt: skip


def openai_calls(job_id: str, calls: list[tool_calls.ToolCall]) -> list[dict[str, Any]]:
    """OpenAI's tool calls: ids from the job's, so that every reading of an answer has the same."""
    return [
        {
            "id": f"call_{job_id}_{i}",
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
        }
        for i, call in enumerate(calls)
    ]
