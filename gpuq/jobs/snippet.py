"""A job in a few words, for lists: its batch line's ``custom_id``, else the start of what
it asks (a prompt, the last message, the first text to embed), on one line."""

from __future__ import annotations

from typing import Any

SNIPPET_CHARS = 80


def _text(content: Any) -> str:
    """A message's content: a string, or OpenAI's parts (the text ones)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _asked(request: dict[str, Any]) -> str:
    prompt = request.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if request.get("prompt_token_ids"):
        return f"{len(request['prompt_token_ids'])} token ids"
    messages = request.get("messages")
    if isinstance(messages, list) and messages:
        last = messages[-1]
        return _text(last.get("content")) if isinstance(last, dict) else ""
    texts = request.get("input")
    if isinstance(texts, str):
        return texts
    if isinstance(texts, list) and texts:
        more = f" (+{len(texts) - 1} more)" if len(texts) > 1 else ""
        return f"{texts[0]}{more}" if isinstance(texts[0], str) else f"{len(texts)} inputs"
    return ""


def snippet(request: dict[str, Any], custom_id: str | None, *, limit: int = SNIPPET_CHARS) -> str:
    """``custom_id`` if it has one (a batch line is known by it), else the start of its prompt,
    whitespace folded, cut at ``limit`` characters with an ellipsis."""
    if custom_id:
        return custom_id
    flat = " ".join(_asked(request).split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"
