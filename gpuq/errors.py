"""The one exception gpuq raises for a request it refuses; the API turns it into a 4xx/5xx."""

from __future__ import annotations


class RequestError(Exception):
    """``status`` is the HTTP status; ``message`` says what to fix; ``headers`` go with the
    response (``Retry-After`` on a 429, ``WWW-Authenticate`` on a 401)."""

    def __init__(self, status: int, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers
