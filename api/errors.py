"""Error responses: one JSON shape for every refusal, whatever raised it.

gpuq's routes and the OpenAI-compatible ones answer

    {"detail": "<what to fix>", "error": {"message": "<the same>", "type": ..., "param": ..., "code": ...}}

``detail`` is what gpuq's CLI, dashboard and FastAPI habits read; ``error`` is OpenAI's
error object, which the ``openai`` SDK puts in its exceptions, so the same sentence reaches
users of either. Ollama's routes (``/api/...``) answer ``{"error": "<what to fix>"}``, the
shape Ollama's clients read. Anthropic's routes (``/v1/messages...``) answer Anthropic's
``{"type": "error", "error": {"type": "invalid_request_error", "message": ...}}``, which the
``anthropic`` SDK reads, and never a 422: Anthropic answers every invalid request with a 400.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.exceptions import HTTPException

from api.schemas.common import ErrorBody
from gpuq.db.tables import JobKind
from gpuq.errors import RequestError, unavailable

log = logging.getLogger(__name__)

OLLAMA_PREFIX = "/api/"
ANTHROPIC_PATH = "/v1/messages"  # and every path under it
# Anthropic's error types by status; any other 4xx is an invalid request, any other 5xx an api_error.
ANTHROPIC_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}

# Pydantic puts the union tag in an error's location (body.generate.prompt); users never wrote it.
_HIDDEN_LOCATION_PARTS = {"body", "query", "path", "header", *(kind.value for kind in JobKind)}


# What each refusal means, as the OpenAPI document describes it (api/openapi.py).
ERROR_DESCRIPTIONS = {
    400: "The request cannot be read: the body is not valid JSON, or not a multipart upload",
    401: "No API key, or one that is unknown or revoked",
    403: "The key may not do this: it needs an admin key, or a submitter named another tenant",
    404: "No such object (another tenant's objects answer the same)",
    409: "The object's state does not allow it now (`detail` says why)",
    413: "The request body is over the size limit",
    422: "A value is invalid: `detail` names the field and says what to fix; nothing was changed",
    429: "Over the key's limits; `Retry-After` says when trying again can succeed",
    500: "A fault in gpuq, not in the request; the details are in the server's log",
    503: "The job queue (Redis) is unavailable; nothing was queued",
    507: "The server's disk is full; nothing was stored",
}


def errors(*statuses: int, other: Mapping[int, dict[str, Any]] | None = None) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route or router: the refusals it answers beyond those api/openapi.py
    adds to every operation (400, 401, 413, 422 and 500, where they apply), and ``other``
    responses (a second success status, a content type other than JSON)."""
    declared: dict[int | str, dict[str, Any]] = {status: response for status, response in (other or {}).items()}
    declared.update({status: {"model": ErrorBody, "description": ERROR_DESCRIPTIONS[status]} for status in statuses})
    return declared


def error_type(status: int) -> str:
    """OpenAI's error ``type`` for an HTTP status."""
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def is_anthropic(path: str) -> bool:
    return path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/")


def anthropic_type(status: int) -> str:
    return ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_content(path: str, status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict:
    """The body of an error response for a request to path."""
    if path.startswith(OLLAMA_PREFIX):
        return {"error": message}
    if is_anthropic(path):
        return {"type": "error", "error": {"type": anthropic_type(status), "message": message}}
    return {
        "detail": message,
        "error": {"message": message, "type": error_type(status), "param": param, "code": code},
    }


def error_response(
    request: Request,
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    path = request.url.path
    if status == 422 and is_anthropic(path):
        status = 400  # Anthropic's status for every invalid request
    content = error_content(path, status, message, param=param, code=code)
    return JSONResponse(content, status_code=status, headers=headers)


def _location(error: dict[str, Any]) -> str:
    return ".".join(str(part) for part in error.get("loc", ()) if part not in _HIDDEN_LOCATION_PARTS)


def _describe(error: dict[str, Any]) -> str:
    location = _location(error)
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    return f"{location}: {message}" if location else message


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = list(exc.errors())
    invalid_json = next((e for e in errors if e.get("type") == "json_invalid"), None)
    if invalid_json is not None:
        reason = invalid_json.get("ctx", {}).get("error", "parse error")
        return error_response(request, 400, f"the request body is not valid JSON ({reason})", code="invalid_json")
    param = _location(errors[0]) or None if errors else None
    return error_response(request, 422, "; ".join(_describe(e) for e in errors), param=param, code="invalid_value")


async def _request_error(request: Request, exc: RequestError) -> JSONResponse:
    return error_response(request, exc.status, exc.message, param=exc.param, code=exc.code, headers=exc.headers)


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's and FastAPI's own refusals: no such route (404), a method the route lacks
    (405), a body that cannot be parsed (400), one over the size limit (413, api/body_limit.py)."""
    code = None
    if exc.status_code == 404:
        message = f"there is no endpoint {request.method} {request.url.path}"
    elif exc.status_code == 405:
        message = f"{request.url.path} does not take {request.method}"
    elif exc.status_code == 400:
        message = (
            "the request body could not be parsed: send JSON with `Content-Type: application/json`, "
            "or a file upload as multipart/form-data"
        )
        code = "invalid_body"
    else:
        message = str(exc.detail)
        code = "body_too_large" if exc.status_code == 413 else None
    return error_response(request, exc.status_code, message, code=code, headers=dict(exc.headers or {}) or None)


async def _server_error(request: Request, exc: Exception) -> JSONResponse:
    """Anything else is gpuq's fault, not the caller's: the same JSON shape, a 500, and the
    traceback in the server's log (Starlette re-raises it after this response). The
    exception's own text stays in the log: it can hold SQL, paths or other tenants' data."""
    log.error("%s %s failed with %s", request.method, request.url.path, type(exc).__name__)
    message = (
        f"internal server error ({type(exc).__name__}): a fault in gpuq, not in the request; "
        "the details are in the server's log"
    )
    return error_response(request, 500, message, code="internal_error")


async def _database_unavailable(request: Request, exc: Exception) -> JSONResponse:
    """The database did not answer (down, restarting, failing over, or SQLite locked past its
    busy timeout): a 503 the client may retry, never a 500. The pool's pre-ping replaces
    dead connections, so requests succeed again as soon as the database is back."""
    if isinstance(exc, DBAPIError) and not exc.connection_invalidated and not _is_unavailable(exc):
        raise exc  # a real error in a statement: not an outage
    log.warning("database unavailable for %s %s: %s", request.method, request.url.path, exc)
    return await _request_error(
        request, unavailable("the database is unavailable; retry shortly", code="database_unavailable")
    )


async def _redis_unavailable(request: Request, exc: Exception) -> JSONResponse:
    log.warning("Redis unavailable for %s %s: %s", request.method, request.url.path, exc)
    return await _request_error(
        request, unavailable("the job queue (Redis) is unavailable; retry shortly", code="queue_unavailable")
    )


def _is_unavailable(exc: DBAPIError) -> bool:
    """OperationalError and InterfaceError are how both drivers report a lost or refused
    connection (and SQLite a lock held past the busy timeout)."""
    return type(exc).__name__ in {"OperationalError", "InterfaceError"}


def install_error_handlers(app: FastAPI) -> None:
    # FastAPI's decorator form: Starlette's add_exception_handler types a handler as taking any Exception.
    app.exception_handler(RequestValidationError)(_validation_error)
    app.exception_handler(RequestError)(_request_error)
    app.exception_handler(HTTPException)(_http_error)
    for database_outage in (DBAPIError, DisconnectionError, PoolTimeoutError):
        app.exception_handler(database_outage)(_database_unavailable)
    for redis_outage in (RedisConnectionError, RedisTimeoutError):
        app.exception_handler(redis_outage)(_redis_unavailable)
    app.exception_handler(Exception)(_server_error)
