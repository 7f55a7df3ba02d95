"""Request bodies read as JSON whatever their ``Content-Type`` says, as Ollama's server and
llama.cpp's read them.

Ollama's own examples post with ``curl -d '{...}'``, which labels the body
``application/x-www-form-urlencoded``, and litellm's Ollama providers send no type at all;
FastAPI reads only a body labelled JSON as JSON, and answered these a 422 about a field it
never found. So a body with no type, the form type or ``text/plain`` is relabelled
``application/json`` before the app sees it: every route and check downstream (the input
guard, the body's validation) then treats it as the JSON it is, and a body that is not JSON
is the route's ordinary 400 ("the request body is not valid JSON"). Multipart uploads and
every other type are left as they are, and so is anything under ``upload_prefix`` (the
files API, whose uploads are multipart).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

# What clients that mean JSON label it when they do not say so (curl -d; fetch() with a string).
_RELABELLED = (b"", b"application/x-www-form-urlencoded", b"text/plain")
_WITH_BODY = ("POST", "PUT", "PATCH")


class JsonBodiesMiddleware:
    def __init__(self, app: ASGIApp, *, upload_prefix: str) -> None:
        self.app = app
        self.upload_prefix = upload_prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope.get("method") in _WITH_BODY
            and not str(scope.get("path", "")).startswith(self.upload_prefix)
        ):
            headers = [(name, value) for name, value in scope.get("headers", ()) if name != b"content-type"]
            declared = dict(scope.get("headers", ())).get(b"content-type", b"")
            if declared.split(b";", 1)[0].strip().lower() in _RELABELLED:
                scope = dict(scope, headers=[*headers, (b"content-type", b"application/json")])
        await self.app(scope, receive, send)
