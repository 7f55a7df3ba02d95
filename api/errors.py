"""Error responses: every 4xx carries a ``detail`` sentence that says what to fix."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from gpuq.db.tables import JobKind
from gpuq.errors import RequestError

# Pydantic puts the union tag in an error's location (body.generate.prompt); users never wrote it.
_HIDDEN_LOCATION_PARTS = {"body", *(kind.value for kind in JobKind)}


def _describe(error: dict) -> str:
    location = ".".join(str(part) for part in error.get("loc", ()) if part not in _HIDDEN_LOCATION_PARTS)
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    return f"{location}: {message}" if location else message


async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        ctx = next(e for e in errors if e.get("type") == "json_invalid").get("ctx", {})
        return JSONResponse(
            {"detail": f"the request body is not valid JSON ({ctx.get('error', 'parse error')})"}, status_code=400
        )
    return JSONResponse({"detail": "; ".join(_describe(e) for e in errors)}, status_code=422)


async def _request_error(_request: Request, exc: RequestError) -> JSONResponse:
    return JSONResponse({"detail": exc.message}, status_code=exc.status, headers=exc.headers)


def install_error_handlers(app: FastAPI) -> None:
    # FastAPI's decorator form: Starlette's add_exception_handler types a handler as taking any Exception.
    app.exception_handler(RequestValidationError)(_validation_error)
    app.exception_handler(RequestError)(_request_error)
