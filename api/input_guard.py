"""One check every route runs before its own: text the database could not store.

A NUL character (U+0000) or a lone UTF-16 surrogate in a path parameter, a query parameter or anywhere in a JSON
body is refused with a 422 naming where it is, and so is a JSON body nested deeper than
``MAX_DEPTH`` (see gpuq/json_checks.py). Without it a NUL in a job id or a model name
reaches PostgreSQL, which cannot hold it, and the request fails with a 500; SQLite would
store it, so the same request would mean different things on the two databases.

It is an app-wide dependency (``FastAPI(dependencies=...)``): FastAPI has parsed a JSON
body by the time dependencies run, and ``request.json()`` returns that parse again; and
only a body whose bytes hold a ``\\u0000`` escape or many brackets is walked at all. A
Message Batch's body is the exception: its route streams it to disk and makes the same
checks as it reads it (gpuq/batches/message_batch_body.py), so it is never held whole here.
Headers need no check: HTTP servers refuse NUL in them.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.dependencies.utils import get_flat_params

from gpuq.errors import RequestError
from gpuq.json_checks import (
    NUL,
    NUL_ESCAPE,
    depth_message,
    has_lone_surrogate,
    may_be_too_deep,
    may_hold_surrogate,
    nul_location,
    nul_message,
    surrogate_location,
    surrogate_message,
    too_deep,
)

MESSAGE_BATCHES = "/v1/messages/batches"
# The drop-in routes answer a bad value 400, as OpenAI and Ollama do; gpuq's own say 422.
_DROP_IN = ("/api/", "/v1/chat/", "/v1/completions", "/v1/embeddings", "/tokenize", "/detokenize")


def _refuse_nul(where: str, param: str) -> None:
    raise RequestError(422, nul_message(where), param=param, code="invalid_value")


def _refuse_surrogate(request: Request, where: str, param: str) -> None:
    status = 400 if request.url.path.startswith(_DROP_IN) else 422
    raise RequestError(status, surrogate_message(where), param=param, code="invalid_value")


async def _check_json_body(request: Request) -> None:
    if "json" not in request.headers.get("content-type", ""):
        return  # not JSON: form uploads check their own fields (file names: gpuq/batches/files.py)
    if request.method == "POST" and request.url.path == MESSAGE_BATCHES:
        return  # read by its route as it streams, never whole, and checked there (gpuq/batches/message_batch_body.py)
    raw = await request.body()
    surrogate = may_hold_surrogate(raw)
    if not (NUL_ESCAPE in raw or surrogate or may_be_too_deep(raw)):
        return
    try:
        body = await request.json()
    except ValueError:
        return  # a route without a body never parsed it, and does not read it
    if too_deep(body):
        raise RequestError(422, depth_message("the request body"), code="invalid_value")
    where = nul_location(body)
    if where is not None:
        _refuse_nul(f"`{where}`" if where else "the request body", where or "body")
    where = surrogate_location(body) if surrogate else None
    if where is not None:
        _refuse_surrogate(request, f"`{where}`" if where else "the request body", where or "body")


def _declared_query_parameters(request: Request) -> set[str]:
    """The query parameters the matched route reads (its own and its dependencies'); others
    are never read, so whatever they hold reaches nothing."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    return {param.alias for param in get_flat_params(dependant)} if dependant is not None else set()


async def refuse_unstorable_input(request: Request) -> None:
    for name, value in request.path_params.items():
        if NUL in str(value):
            _refuse_nul(f"the path parameter `{name}`", name)
        if has_lone_surrogate(str(value)):
            _refuse_surrogate(request, f"the path parameter `{name}`", name)
    declared = _declared_query_parameters(request)
    for name, value in request.query_params.multi_items():
        if name in declared and NUL in value:
            _refuse_nul(f"the query parameter `{name}`", name)
        if name in declared and has_lone_surrogate(value):
            _refuse_surrogate(request, f"the query parameter `{name}`", name)
    await _check_json_body(request)
