"""The Responses API's items and chat messages, both ways.

A ``POST /v1/responses`` call's ``input`` is a text or a list of items: messages (``role``
user, system, developer or assistant; ``content`` a text or ``input_text``/``output_text``
parts), the model's earlier ``function_call`` items and the client's ``function_call_output``
items. A job's request holds chat messages (gpuq/jobs/request.py), which the model's chat
template renders: consecutive calls become one assistant message's ``tool_calls`` (after the
assistant's text, if it said something first), and each output a ``tool`` message. Read back
(``GET /v1/responses/{id}/input_items``), the messages become items again.
"""

from __future__ import annotations

from typing import Any

from gpuq.errors import RequestError

_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


def unsupported(param: str, why: str) -> RequestError:
    return RequestError(400, f"{param} is not supported by gpuq: {why}", param=param, code="unsupported_parameter")


def _invalid(param: str, message: str) -> RequestError:
    return RequestError(400, f"{param}: {message}", param=param, code="invalid_value")


def messages_of(given: Any, *, calls_before: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The chat messages of a call's ``input``; a 400 naming the first item gpuq cannot take.
    ``calls_before``: call id -> function name of the conversation's earlier calls (so that a
    ``tool`` message names its function, as some templates want)."""
    if isinstance(given, str):
        if not given:
            raise _invalid("input", "the input is empty")
        return [{"role": "user", "content": given}]
    if not isinstance(given, list) or not given:
        raise _invalid("input", "give a text or a non-empty list of items")
    names = dict(calls_before or {})
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(given):
        if not isinstance(item, dict):
            raise _invalid(f"input[{i}]", "an item is a JSON object")
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, f"input[{i}]"))
        elif kind == "function_call":
            call = _call(item, f"input[{i}]")
            names[call["id"]] = call["function"]["name"]
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # its text, then its calls
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append(_output(item, f"input[{i}]", names))
        else:
            raise unsupported(
                f"input[{i}]", f"items of type {kind!r} (messages, function_call and function_call_output)"
            )
    return messages


def _message(item: dict[str, Any], param: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in _ROLES:
        raise _invalid(f"{param}.role", f"{role!r}: one of {', '.join(_ROLES)}")
    content = item.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in _TEXT_PARTS:
                raise unsupported(f"{param}.content[{j}]", f"content parts of type {kind!r} (text only)")
            text_of = part.get("refusal" if kind == "refusal" else "text")
            if not isinstance(text_of, str):
                raise _invalid(f"{param}.content[{j}].text", "a text part needs its text")
            texts.append(text_of)
        text = "".join(texts)
    else:
        raise _invalid(f"{param}.content", "a text or a list of text parts")
    return {"role": "system" if role == "developer" else role, "content": text}


def _call(item: dict[str, Any], param: str) -> dict[str, Any]:
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
    for field, value in (("call_id", call_id), ("name", name), ("arguments", arguments)):
        if not isinstance(value, str) or (field != "arguments" and not value):
            raise _invalid(f"{param}.{field}", "a function_call item names its call_id, name and arguments (text)")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _output(item: dict[str, Any], param: str, names: dict[str, str]) -> dict[str, Any]:
    call_id, output = item.get("call_id"), item.get("output")
    if not isinstance(call_id, str) or not call_id:
        raise _invalid(f"{param}.call_id", "a function_call_output item names the call it answers")
    if isinstance(output, list):  # output as content parts: text only
        output = "".join(str(part.get("text", "")) for part in output if isinstance(part, dict))
    if not isinstance(output, str):
        raise _invalid(f"{param}.output", "the function's output as a text")
    message: dict[str, Any] = {"role": "tool", "content": output, "tool_call_id": call_id}
    if call_id in names:
        message["name"] = names[call_id]
    return message


def call_names(messages: list[dict[str, Any]]) -> dict[str, str]:
    """call id -> function name, of every call an assistant made in ``messages``."""
    return {
        call["id"]: call["function"]["name"]
        for message in messages
        for call in message.get("tool_calls") or ()
        if isinstance(call, dict) and isinstance(call.get("id"), str)
    }


def items_of(messages: list[dict[str, Any]], *, prefix: str) -> list[dict[str, Any]]:
    """The Responses items of chat messages, each with an id from ``prefix`` and its place."""
    items: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        role, text = message["role"], message.get("content") or ""
        if role == "tool":
            items.append(
                {
                    "id": f"fco_{prefix}_{i}",
                    "type": "function_call_output",
                    "call_id": message.get("tool_call_id"),
                    "output": text,
                    "status": "completed",
                }
            )
            continue
        calls = message.get("tool_calls") or []
        if text or not calls:
            items.append(message_item(f"msg_{prefix}_{i}", role, text))
        items += [function_call_item(f"fc_{prefix}_{i}_{j}", call) for j, call in enumerate(calls)]
    return items


def message_item(item_id: str, role: str, text: str, *, status: str = "completed") -> dict[str, Any]:
    content = [output_text(text)] if role == "assistant" else [{"type": "input_text", "text": text}]
    return {"id": item_id, "type": "message", "role": role, "status": status, "content": content}


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_call_item(item_id: str, call: dict[str, Any], *, status: str = "completed") -> dict[str, Any]:
    """A chat tool call (``{"id", "type": "function", "function": {"name", "arguments"}}``) as an item."""
    fn = call.get("function") or {}
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call.get("id"),
        "name": fn.get("name"),
        "arguments": fn.get("arguments", ""),
        "status": status,
    }
