"""One table from domain errors to HTTP answers. Nothing reaches the client as a 500
unless it is a real bug, and then without internals.

Every error answer has the same body, :class:`Problem`; routes declare the error
statuses they can answer with :func:`problem_responses`, so the OpenAPI schema
documents each of them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgspec
from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException
from litestar.openapi import ResponseSpec

from config import ConfigError
from indexers.base import (
    BackendError,
    EmbeddingRefused,
    EmbeddingUnavailable,
    StoreUnavailable,
    UnstorableValue,
    WriteTimeout,
)
from indexers.reindex import ReindexBusy

from .validate import InputError

__all__ = ["Problem", "exception_handlers", "problem_responses"]

log = logging.getLogger("braid.http")


class Problem(msgspec.Struct):
    """The body of every error answer."""

    status_code: int
    #: What is wrong, in words; for a bad body, each bad field and why.
    detail: str
    #: The validation errors behind a 400 (``key``, ``message``, ``source``), when there are any.
    extra: list[Any] | dict[str, Any] | None = None
    #: The reindex job already queued or running (409).
    job_id: str | None = None


#: What each error status means, as the OpenAPI schema says it.
_MEANING: dict[int, str] = {
    400: "The request cannot be served as sent; `detail` names the field and what is wrong",
    401: "No API key, or an unknown one (`WWW-Authenticate: Bearer`)",
    403: "This endpoint needs an admin key",
    404: "No such resource in this key's tenant",
    409: "A reindex job is already queued or running; `job_id` names it",
    413: "The body is larger than `server.maxBodyBytes`",
    415: "The body is not sent as JSON (`Content-Type: application/json`)",
    429: "Too many requests for this key; retry after `Retry-After` seconds",
    503: (
        "A backend is unavailable and nothing was written, or Postgres did not finish a write "
        "in time and its outcome is unknown (`detail` says which; a retry with the same ids is "
        "safe); retry after `Retry-After` seconds"
    ),
}


def problem_responses(*statuses: int) -> dict[int, ResponseSpec]:
    """OpenAPI ``responses`` for a route: each status with the :class:`Problem` body."""
    return {
        status: ResponseSpec(data_container=Problem, generate_examples=False, description=_MEANING[status])
        for status in statuses
    }


def _problem(status: int, detail: str, **extra: Any) -> Response[dict[str, Any]]:
    body: dict[str, Any] = {"status_code": status, "detail": detail}
    body.update(extra)
    return Response(body, status_code=status, media_type=MediaType.JSON)


def _input_error(_: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, Any]]:
    return _problem(400, str(exc))


def _unavailable(_: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, Any]]:
    log.warning("backend unavailable: %s%s", exc, f" ({exc.reason})" if isinstance(exc, StoreUnavailable) else "")
    if (isinstance(exc, StoreUnavailable) and exc.during == "write") or isinstance(exc, EmbeddingUnavailable):
        # A write's texts are embedded before anything is stored.
        detail = f"{exc}; nothing was written, retry later"
    else:  # a read, a write of unknown outcome (WriteTimeout says so), a source
        detail = f"{exc}; retry later" if not isinstance(exc, WriteTimeout) else str(exc)
    return Response(
        {"status_code": 503, "detail": detail},
        status_code=503,
        headers={"Retry-After": "1"},
        media_type=MediaType.JSON,
    )


def _http(request: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, Any]]:
    assert isinstance(exc, HTTPException)
    extra: dict[str, Any] = {}
    detail = exc.detail
    if exc.extra:
        extra["extra"] = exc.extra
        # Body validation: say which field and what is wrong in the detail itself.
        if isinstance(exc.extra, list) and all(isinstance(e, dict) for e in exc.extra):
            parts = [
                f"{e['key']}: {e['message']}" if e.get("key") and e.get("key") != "data" else str(e.get("message"))
                for e in exc.extra
            ]
            detail = "; ".join(parts)
    response = _problem(exc.status_code, detail, **extra)
    if exc.headers:
        response.headers.update(exc.headers)
    if exc.status_code == 401:
        response.headers["WWW-Authenticate"] = "Bearer"
    return response


def _internal(request: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, Any]]:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return _problem(500, "internal error; see the service log")


def _busy(_: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, Any]]:
    assert isinstance(exc, ReindexBusy)
    return _problem(409, str(exc), job_id=exc.job_id)


def exception_handlers() -> dict[type[Exception] | int, Callable[..., Response[Any]]]:
    """The one table from the error tree (:class:`config.BraidError`) to answers."""
    return {
        InputError: _input_error,
        ConfigError: _input_error,
        UnstorableValue: _input_error,
        EmbeddingRefused: _input_error,
        ReindexBusy: _busy,
        BackendError: _unavailable,
        HTTPException: _http,
        Exception: _internal,
    }
