"""Checks on JSON that users send, for what the parser and the database cannot take.

* **NUL characters** (U+0000): PostgreSQL's text columns cannot hold them, so an id, a
  model name or a custom_id carrying one would fail inside the database. gpuq refuses
  them wherever text arrives (URLs, JSON bodies, batch lines), on SQLite as on
  PostgreSQL, so the same request gets the same answer on both.
* **Nesting**: Python's parser and encoder recurse once per level; a line of a few
  thousand brackets would exhaust the stack. ``MAX_DEPTH`` is far beyond any real
  request (an OpenAI body is a handful of levels deep).

Both walks are iterative, and the callers skip them when the raw bytes show there is
nothing to find (no ``\\u0000`` escape; fewer brackets than ``MAX_DEPTH``), so ordinary
input pays two substring scans.
"""

from __future__ import annotations

from typing import Any

MAX_DEPTH = 64
NUL = "\x00"
NUL_ESCAPE = b"\\u0000"  # how JSON spells a NUL character (a raw one is not valid JSON)


def nul_message(where: str) -> str:
    return f"{where} contains a NUL character (U+0000), which gpuq cannot store; remove it"


def depth_message(where: str) -> str:
    return f"{where} is nested more than {MAX_DEPTH} levels deep; flatten it"


def may_be_too_deep(raw: bytes) -> bool:
    """False when ``raw`` has too few brackets to be nested ``MAX_DEPTH`` deep."""
    return raw.count(b"[") + raw.count(b"{") > MAX_DEPTH


def nul_location(value: Any, path: str = "") -> str | None:
    """The dotted path of the first string (or key) holding a NUL character, else None.
    The value itself, when it is such a string, is ``path``."""
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            if NUL in item:
                return where
        elif isinstance(item, dict):
            for key, child in item.items():
                child_path = f"{where}.{key}" if where else str(key)
                if isinstance(key, str) and NUL in key:
                    return child_path
                stack.append((child_path, child))
        elif isinstance(item, list):
            stack.extend((f"{where}[{i}]", child) for i, child in enumerate(item))
    return None


def too_deep(value: Any, max_depth: int = MAX_DEPTH) -> bool:
    """Whether lists and objects nest more than ``max_depth`` levels in ``value``."""
    stack: list[tuple[int, Any]] = [(1, value)]
    while stack:
        depth, item = stack.pop()
        if isinstance(item, dict | list):
            if depth > max_depth:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((depth + 1, child) for child in children)
    return False
