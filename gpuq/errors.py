"""The one exception gpuq raises for a request it refuses; the API turns it into a 4xx/5xx."""

from __future__ import annotations


class RequestError(Exception):
    """``status`` is the HTTP status; ``message`` says what to fix; ``headers`` go with the
    response (``Retry-After`` on a 429, ``WWW-Authenticate`` on a 401). ``param`` names the
    request field at fault and ``code`` is a stable machine-readable reason
    (``model_not_found``), both as OpenAI's error object carries them."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers
        self.param = param
        self.code = code


# What a 503 asks clients to wait before retrying: outages of Redis or the database that
# gpuq rides out (a restart, a failover) last seconds.
RETRY_AFTER_S = 5


def unavailable(message: str, *, code: str) -> RequestError:
    """A 503 for a dependency that is down (Redis, the database), with ``Retry-After``."""
    return RequestError(503, message, headers={"Retry-After": str(RETRY_AFTER_S)}, code=code)


def queue_unavailable(exc: Exception) -> RequestError:
    """Redis failed before anything was queued: the request changed nothing and may be retried."""
    return unavailable(f"the job queue (Redis) is unavailable, nothing was queued: {exc}", code="queue_unavailable")
