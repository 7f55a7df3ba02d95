"""Refuse request bodies over a size limit before they are read into memory.

A declared ``Content-Length`` over the limit is refused before the app runs. A body without
one (``Transfer-Encoding: chunked``) is counted as the app reads it, and reading stops with
``BodyTooLarge`` at the first byte over: an ``HTTPException``, because FastAPI turns any
other exception met while it reads a body into a 400, and re-raises these as they are.
"""

from __future__ import annotations

import json

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import error_content


def too_large_message(limit: int) -> str:
    return f"request body is larger than {limit} bytes; split it into smaller requests"


class BodyTooLarge(HTTPException):
    """Raised from inside the app's receive() once the body passes the limit: a 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, too_large_message(limit))


class BodyLimitMiddleware:
    """``max_bytes`` for every path, but ``upload_max_bytes`` for those under ``upload_prefix``
    (one prefix or several: file uploads, and Message Batches, whose requests come inline)."""

    def __init__(
        self, app: ASGIApp, *, max_bytes: int, upload_max_bytes: int, upload_prefix: str | tuple[str, ...]
    ) -> None:
        self.app = app
        self.default_max_bytes = max_bytes
        self.upload_max_bytes = upload_max_bytes
        self.upload_prefix = upload_prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        uploading = str(scope.get("path", "")).startswith(self.upload_prefix)
        limit = self.upload_max_bytes if uploading else self.default_max_bytes
        declared = dict(scope.get("headers", ())).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._refuse(scope, send, limit)
            return
        seen = 0
        response_started = False

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal response_started
            response_started = response_started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLarge:
            if not response_started:
                await self._refuse(scope, send, limit)

    async def _refuse(self, scope: Scope, send: Send, limit: int) -> None:
        message = too_large_message(limit)
        body = json.dumps(error_content(str(scope.get("path", "")), 413, message, code="body_too_large")).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})
