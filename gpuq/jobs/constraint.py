"""Structured output: the JSON schema a generation's text must match, as a grammar.

A constrained job stores its JSON schema in its request (``GenerationParams.json_schema``);
the worker compiles it with llguidance and, at every token, masks the logits row of each
constrained sequence to the tokens the grammar allows (worker/decoding/constraint.py). The
choice of llguidance over llama.cpp's own grammar sampler was measured: see
docs/architecture.md ("Structured output").

**Fail closed.** A schema the engine cannot enforce is refused here, by the API, before any
job exists, naming the keyword (``not``, ``uniqueItems``, ``contains``, ``if``...); llama.cpp's
own server and converters ignore such keywords and answer unconstrained text. Annotations
(``title``, ``description``, ``examples``) and unknown keywords constrain nothing in JSON
Schema, and llguidance ignores them too.

The JSON is compact (no whitespace between tokens, as OpenAI's structured outputs are): a
small model given free whitespace can spend its whole budget on newlines.
"""

from __future__ import annotations

import json
from typing import Any

from gpuq.errors import RequestError

# OpenAI's json_object mode: any JSON object.
ANY_OBJECT: dict[str, Any] = {"type": "object"}


class UnenforceableSchema(ValueError):
    """The schema is not one the engine can enforce token by token (the message says why)."""


def grammar(schema: dict[str, Any]) -> str:
    """llguidance's grammar for ``schema``; UnenforceableSchema naming what it cannot enforce."""
    from llguidance import LLMatcher

    if not isinstance(schema, dict):
        raise UnenforceableSchema("a JSON schema is a JSON object")
    try:
        compiled = LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides={"whitespace_flexible": False})
    except ValueError as exc:
        raise UnenforceableSchema(str(exc)) from None
    problem = LLMatcher.validate_grammar(compiled)
    if problem:
        raise UnenforceableSchema(_plain(problem))
    return compiled


def check(schema: dict[str, Any]) -> None:
    """Raises UnenforceableSchema if the engine cannot enforce ``schema``."""
    grammar(schema)


def _plain(problem: str) -> str:
    """llguidance's message, said for a caller: 'Unimplemented keys: ["not"]' names the keyword."""
    if problem.startswith("Unimplemented keys:"):
        keys = problem.removeprefix("Unimplemented keys:").strip()
        return f"the keyword(s) {keys} cannot be enforced while sampling; remove them from the schema"
    return f"the schema cannot be enforced while sampling: {problem}"


def enforceable(schema: Any, param: str) -> dict[str, Any]:
    """``schema`` if the engine can enforce it; a 400 naming ``param`` and the keyword if not."""
    try:
        check(schema)
    except UnenforceableSchema as exc:
        raise RequestError(400, f"{param}: {exc}", param=param, code="unsupported_schema") from None
    return dict(schema)
