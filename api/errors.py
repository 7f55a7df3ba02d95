"""Error responses: one JSON shape for every refusal, whatever raised it.

gpuq's routes and the OpenAI-compatible ones answer

    {"detail": "<what to fix>", "error": {"message": "<the same>", "type": ..., "param": ..., "code": ...}}

``detail`` is what gpuq's CLI, dashboard and FastAPI habits read; ``error`` is OpenAI's
error object, which the ``openai`` SDK puts in its exceptions, so the same sentence reaches
users of either. Ollama's routes (``/api/...``) answer ``{"error": "<what to fix>"}``, the
shape Ollama's clients read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from gpuq.db.tables import JobKind
from gpuq.errors import RequestError

OLLAMA_PREFIX = "/api/"

# Pydantic puts the union tag in an error's location (body.generate.prompt); users never wrote it.
_HIDDEN_LOCATION_PARTS = {"body", "query", "path", "header", *(kind.value for kind in JobKind)}


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


def error_content(path: str, status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict:
    """The body of an error response for a request to path."""
    if path.startswith(OLLAMA_PREFIX):
        return {"error": message}
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
    content = error_content(request.url.path, status, message, param=param, code=code)
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
    """Starlette's own refusals: no such route (404), a method the route lacks (405)."""
    if exc.status_code == 404:
        message = f"there is no endpoint {request.method} {request.url.path}"
    elif exc.status_code == 405:
        message = f"{request.url.path} does not take {request.method}"
    else:
        message = str(exc.detail)
    return error_response(request, exc.status_code, message, headers=exc.headers)


def install_error_handlers(app: FastAPI) -> None:
    # FastAPI's decorator form: Starlette's add_exception_handler types a handler as taking any Exception.
    app.exception_handler(RequestValidationError)(_validation_error)
    app.exception_handler(RequestError)(_request_error)
    app.exception_handler(HTTPException)(_http_error)
