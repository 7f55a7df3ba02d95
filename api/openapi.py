"""The OpenAPI document, made to say what the server answers.

FastAPI documents each route's success and a 422 with its own validation-error array,
which gpuq never sends (api/errors.py answers every refusal in one shape). This rewrites
every error response to that shape, ``ErrorBody`` (Ollama's ``{"error"}`` under ``/api/``),
and adds the refusals every route of a kind can answer: 401 where a key is needed (the
routes FastAPI marks with the bearer security scheme), 400 and 413 where there is a
body, 422 where anything is read from the request, and 500 everywhere. What only some
routes answer (404, 409, 429, 503, and 403 for admins' routes) they declare themselves,
with ``responses=errors(...)``. Anthropic's routes (``/v1/messages...``) answer
``AnthropicErrorBody``, and a 400 where others answer 422.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from api.errors import ERROR_DESCRIPTIONS, OLLAMA_PREFIX, is_anthropic
from api.schemas.anthropic import AnthropicErrorBody, MessageBatchCreate
from api.schemas.common import ErrorBody, OllamaErrorBody

METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
# FastAPI's own validation-error schemas, which no response of gpuq's has.
_FASTAPI_ERROR_SCHEMAS = ("HTTPValidationError", "ValidationError")
_HEADERS = {
    401: {"WWW-Authenticate": {"description": "`Bearer`", "schema": {"type": "string"}}},
    429: {"Retry-After": {"description": "seconds to wait before trying again", "schema": {"type": "string"}}},
}


def _schema_ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _common_errors(operation: dict[str, Any]) -> list[int]:
    statuses = [500]
    if operation.get("security"):
        statuses.append(401)
    if "requestBody" in operation:
        statuses += [400, 413, 422]
    if operation.get("parameters"):
        statuses.append(422)
    return statuses


def _error_schema(path: str) -> str:
    if path.startswith(OLLAMA_PREFIX):
        return "OllamaErrorBody"
    return "AnthropicErrorBody" if is_anthropic(path) else "ErrorBody"


def _declare_errors(path: str, operation: dict[str, Any]) -> None:
    responses: dict[str, Any] = operation.setdefault("responses", {})
    statuses = _common_errors(operation)
    if is_anthropic(path):  # Anthropic answers every invalid request with a 400 (api/errors.py)
        responses.pop("422", None)
        statuses = [400 if status == 422 else status for status in statuses]
    for status in statuses:
        responses.setdefault(str(status), {})
    body = _schema_ref(_error_schema(path))
    for code, response in responses.items():
        status = int(code) if code.isdigit() else 0
        if status < 400:
            continue
        schema = response.get("content", {}).get("application/json", {}).get("schema")
        if schema is None or schema.get("$ref", "").rsplit("/", 1)[-1] in (
            *_FASTAPI_ERROR_SCHEMAS,
            "ErrorBody",
            "AnthropicErrorBody",
        ):
            response["content"] = {"application/json": {"schema": body}}
            if status in ERROR_DESCRIPTIONS and response.get("description", "Validation Error") == "Validation Error":
                response["description"] = ERROR_DESCRIPTIONS[status]
        if status in _HEADERS:
            response["headers"] = _HEADERS[status]
    operation["responses"] = dict(sorted(responses.items()))


def build_openapi(app: FastAPI) -> dict[str, Any]:
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    for path, item in doc.get("paths", {}).items():
        for method in METHODS:
            if method in item:
                _declare_errors(path, item[method])
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for name in _FASTAPI_ERROR_SCHEMAS:
        schemas.pop(name, None)
    # MessageBatchCreate: a body its route reads itself, as it streams (openapi_extra names it).
    for model in (ErrorBody, OllamaErrorBody, AnthropicErrorBody, MessageBatchCreate):
        definition = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(definition.pop("$defs", {}))
        schemas[model.__name__] = definition
    return doc


def install_openapi(app: FastAPI) -> None:
    """``app.openapi`` (what ``/openapi.json`` and ``/docs`` serve) built once, by ``build_openapi``."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to replace it
