"""The one exception gpuq raises for a request it refuses; the API turns it into a 4xx/5xx."""

from __future__ import annotations


class RequestError(Exception):
    """``status`` is the HTTP status; ``message`` says what to fix."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
