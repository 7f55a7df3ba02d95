"""Checks on JSON that users send, for what the parser and the database cannot take.

* **NUL characters** (U+0000): PostgreSQL's text columns cannot hold them, so an id, a
  model name or a custom_id carrying one would fail inside the database. gpuq refuses
  them wherever text arrives (URLs, JSON bodies, batch lines), on SQLite as on
  PostgreSQL, so the same request gets the same answer on both.
* **Nesting**: Python's parser and encoder recurse once per level; a line of a few
  thousand brackets would exhaust the stack. ``MAX_DEPTH`` is far beyond any real
  request (an OpenAI body is a handful of levels deep).

* **Lone surrogates** (``"\\udfff"`` with no partner): JSON can spell them and Python's parser
  keeps them, but they are not text: no UTF-8 encoder (the database driver's, the
  tokenizer's) takes them. Refused wherever a NUL is.

The walks are iterative, and the callers skip them when the raw bytes show there is
nothing to find (no ``\\u0000`` escape; fewer brackets than ``MAX_DEPTH``), so ordinary
input pays two substring scans.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

MAX_DEPTH = 64
NUL = "\x00"
NUL_ESCAPE = b"\\u0000"  # how JSON spells a NUL character (a raw one is not valid JSON)
# How JSON spells a surrogate (the only way: raw bytes for one are not valid UTF-8).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def nul_message(where: str) -> str:
    return f"{where} contains a NUL character (U+0000), which gpuq cannot store; remove it"


def depth_message(where: str) -> str:
    return f"{where} is nested more than {MAX_DEPTH} levels deep; flatten it"


def surrogate_message(where: str) -> str:
    return f"{where} contains a lone UTF-16 surrogate (such as \\udfff), which is not text; send valid Unicode"


def may_hold_surrogate(raw: bytes) -> bool:
    """False when ``raw`` spells no surrogate escape, so its parse holds no lone surrogate."""
    return _SURROGATE_ESCAPE.search(raw) is not None


def has_lone_surrogate(text: str) -> bool:
    """A pair parses into one character; what is left of the range is alone."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def surrogate_location(value: Any, path: str = "") -> str | None:
    """The dotted path of the first string (or key) holding a lone surrogate, else None."""
    return _first_string(value, path, has_lone_surrogate)


def may_be_too_deep(raw: bytes) -> bool:
    """False when ``raw`` has too few brackets to be nested ``MAX_DEPTH`` deep."""
    return raw.count(b"[") + raw.count(b"{") > MAX_DEPTH


def nul_location(value: Any, path: str = "") -> str | None:
    """The dotted path of the first string (or key) holding a NUL character, else None.
    The value itself, when it is such a string, is ``path``."""
    return _first_string(value, path, lambda text: NUL in text)


def _first_string(value: Any, path: str, bad: Callable[[str], bool]) -> str | None:
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            if bad(item):
                return where
        elif isinstance(item, dict):
            for key, child in item.items():
                child_path = f"{where}.{key}" if where else str(key)
                if isinstance(key, str) and bad(key):
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
