"""Tool calls: the schema that forces one, and the calls read back from a model's reply.

The model's own chat template renders the tools (gpuq/jobs/prompt.py); what the model
answers is text, in its family's own format. :func:`parse` reads the formats common in GGUF
models, the way llama.cpp's server and vLLM's parsers do:

- Hermes and Qwen: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one or more,
  after optional text;
- Llama 3.x: a JSON object ``{"name": ..., "parameters": {...}}`` (``<|python_tag|>``, a
  special token, is not in the text);
- Mistral: ``[TOOL_CALLS]`` then a JSON array of calls (the marker too may be a special token
  and absent from the text);
- any other model: the whole reply as one JSON call, or an array of them, fenced or not.

Only a call naming one of the request's tools counts: an answer that merely is JSON stays
an answer. ``tool_choice`` ``required`` or a named function is enforced while sampling, with
:func:`forced_schema`, so that even a model that has never seen a tool answers with a valid
call (compact JSON, the plain format that :func:`parse` reads): one call, never several.

A request that asks for no parallel calls (OpenAI's ``parallel_tool_calls: false``,
Anthropic's ``disable_parallel_tool_use``) gets at most one: a forced call is one by its
schema, and a reply the model was free to write (``auto``) is read for its first call only,
the text after it dropped (as vLLM does), so that every reading of the job (the answer, its
stream, a later turn built on it) has the same single call.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)
_MISTRAL = "[TOOL_CALLS]"


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


def function(tool: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI tool's function ({"name", "description", "parameters"}); Ollama's are the same."""
    fn: dict[str, Any] = tool.get("function") or {}
    return fn


def names(tools: list[dict[str, Any]]) -> list[str]:
    return [str(function(tool).get("name")) for tool in tools]


def parameters(tool: dict[str, Any]) -> dict[str, Any]:
    """The function's arguments schema (none given: any object, as OpenAI takes it)."""
    params = function(tool).get("parameters")
    return params if isinstance(params, dict) and params else {"type": "object"}


def forced_schema(tools: list[dict[str, Any]], choice: str | dict[str, Any]) -> dict[str, Any] | None:
    """The schema a reply must match when a call is required (``required``: any of the tools;
    a named function: that one); None when the model may answer in text (``auto``)."""
    if choice == "auto":
        return None
    if isinstance(choice, dict):
        wanted = function(choice).get("name")
        tools = [tool for tool in tools if function(tool).get("name") == wanted]
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": function(tool)["name"]}, "arguments": parameters(tool)},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


def parallel(request: dict[str, Any] | None) -> bool:
    """Whether a job's request lets its reply hold several calls (unless it said no, it does)."""
    return (request or {}).get("parallel_tool_calls") is not False


def parse(text: str, tools: list[dict[str, Any]], *, parallel: bool = True) -> tuple[str | None, list[ToolCall]]:
    """(the reply's text outside its calls, or None if there is none; its calls: only the
    first unless ``parallel``)."""
    content, calls = _parse(text, tools)
    return content, calls if parallel else calls[:1]


def _parse(text: str, tools: list[dict[str, Any]]) -> tuple[str | None, list[ToolCall]]:
    known = set(names(tools))
    if "<tool_call>" in text:
        calls = [call for body in _HERMES.findall(text) for call in _calls(body, known)]
        if calls:
            return _content(text[: text.index("<tool_call>")]), calls
    stripped = text.strip()
    if _MISTRAL in stripped:
        before, _, after = stripped.partition(_MISTRAL)
        calls = _calls(after, known)
        if calls:
            return _content(before), calls
    fenced = _FENCE.match(stripped)
    calls = _calls(fenced.group(1) if fenced else stripped, known)
    if calls:
        return None, calls
    return text, []


def with_calls(request: dict[str, Any], result: dict[str, Any] | None) -> dict[str, Any] | None:
    """A finished job's stored result with, when its request offered tools, each sample's
    calls read back (``tool_calls``, OpenAI's function shape with the arguments as an object,
    and ``content``: the text outside them), as the drop-in routes answer them."""
    tools = request.get("tools")
    if not tools or not result or "text" not in result:
        return result
    several = parallel(request)
    shown = result | _read(result, tools, several)
    if isinstance(result.get("choices"), list):
        shown["choices"] = [c | _read(c, tools, several) if isinstance(c, dict) else c for c in result["choices"]]
    return shown


def _read(sample: dict[str, Any], tools: list[dict[str, Any]], several: bool) -> dict[str, Any]:
    content, calls = parse(str(sample.get("text", "")), tools, parallel=several)
    return {"content": content, "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in calls]}


def _content(text: str) -> str | None:
    return text.strip() or None


def _calls(body: str, known: set[str]) -> list[ToolCall]:
    """The calls in one JSON text (an object or an array of them); none unless every one is
    a call of a known tool."""
    try:
        value = json.loads(body)
    except ValueError:
        return []
    items = value if isinstance(value, list) else [value]
    calls = [_call(item, known) for item in items]
    return [call for call in calls if call is not None] if calls and all(calls) else []


def _call(item: Any, known: set[str]) -> ToolCall | None:
    if not isinstance(item, dict):
        return None
    if isinstance(item.get("function"), dict):  # {"type": "function", "function": {...}}
        item = item["function"]
    name = item.get("name")
    arguments = item.get("arguments", item.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string, as OpenAI sends them
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if name not in known or not isinstance(arguments, dict):
        return None
    return ToolCall(str(name), arguments)
