"""One exception tree for everything the client raises.

:class:`BraidError` is the root. An answer with an error status raises an
:class:`HTTPError` subclass chosen by the status, carrying the status, the
service's message (``detail`` of its problem-details body) and the body
itself. A request that got no answer raises :class:`TransportError`
(:class:`ConnectError`, :class:`Timeout`). Nothing from httpx or msgspec
escapes the client unwrapped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .models import Job

__all__ = [
    "BadRequest",
    "BraidError",
    "ConnectError",
    "Conflict",
    "Forbidden",
    "HTTPError",
    "NotFound",
    "PayloadTooLarge",
    "ProtocolError",
    "RateLimited",
    "ReindexFailed",
    "ServerError",
    "Timeout",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "UnsupportedMediaType",
    "WaitTimeout",
]


class BraidError(Exception):
    """Anything the Braid client raises."""


class HTTPError(BraidError):
    """The service answered with an error status.

    ``status``: the HTTP status; ``detail``: the service's message (what is
    wrong, naming the field); ``body``: the decoded JSON body (or the text when
    it was not JSON); ``method`` and ``path``: the request.
    """

    def __init__(self, status: int, detail: str, body: Any = None, *, method: str = "", path: str = "") -> None:
        self.status = status
        self.detail = detail
        self.body = body
        self.method = method
        self.path = path
        super().__init__(f"{status} {detail}")


class BadRequest(HTTPError):
    """400: the request cannot be served as sent; ``detail`` names the field."""


class Unauthorized(HTTPError):
    """401: no API key, or an unknown one."""


class Forbidden(HTTPError):
    """403: the endpoint needs an admin key."""


class NotFound(HTTPError):
    """404: no such memory, job, entity or relation in the key's tenant."""


class Conflict(HTTPError):
    """409: a reindex job is already queued or running; ``job_id`` names it."""

    @property
    def job_id(self) -> str | None:
        return self.body.get("job_id") if isinstance(self.body, dict) else None


class PayloadTooLarge(HTTPError):
    """413: the body is larger than the service's ``server.maxBodyBytes``."""


class UnsupportedMediaType(HTTPError):
    """415: the body was not sent as JSON."""


class RateLimited(HTTPError):
    """429: over the key's rate limit; ``retry_after`` is the wait the service asked for (seconds)."""

    def __init__(self, *args: Any, retry_after: float | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.retry_after = retry_after


class Unavailable(HTTPError):
    """503: a backend is unavailable (nothing was written) or a write's outcome
    is unknown (a retry with the same ids is safe); ``retry_after`` in seconds."""

    def __init__(self, *args: Any, retry_after: float | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.retry_after = retry_after


class ServerError(HTTPError):
    """Any other 5xx: a bug in the service (its log says more)."""


class ProtocolError(BraidError):
    """The answer was not what the API promises (a body that does not decode)."""


class TransportError(BraidError):
    """No answer: the request could not be sent or its answer did not arrive."""

    def __init__(self, message: str, *, method: str = "", path: str = "") -> None:
        self.method = method
        self.path = path
        super().__init__(message)


class ConnectError(TransportError):
    """The service could not be reached (nothing was sent)."""


class Timeout(TransportError):
    """No answer within the client's timeout."""


class ReindexFailed(BraidError):
    """A reindex job the client waited for ended ``failed`` or ``interrupted``."""

    def __init__(self, job: Job) -> None:
        self.job = job
        super().__init__(f"reindex job {job.job_id} {job.status}: {job.error or 'no error recorded'}")


class WaitTimeout(BraidError):
    """A reindex job the client waited for had not finished in the time given."""


#: Status -> the exception an answer with it raises (other 4xx: HTTPError, other 5xx: ServerError).
BY_STATUS: dict[int, type[HTTPError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    429: RateLimited,
    503: Unavailable,
}
