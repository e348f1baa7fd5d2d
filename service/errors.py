"""One table from domain errors to HTTP answers. Nothing reaches the client as a 500
unless it is a real bug, and then without internals."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import psycopg
import psycopg_pool
from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException

from config import ConfigError
from indexers.base import SourceUnavailable

from .validate import InputError

__all__ = ["exception_handlers"]

log = logging.getLogger("braid.http")


def _problem(status: int, detail: str, **extra: Any) -> Response[dict[str, Any]]:
    body: dict[str, Any] = {"status_code": status, "detail": detail}
    body.update(extra)
    return Response(body, status_code=status, media_type=MediaType.JSON)


def _input_error(_: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, Any]]:
    return _problem(400, str(exc))


def _unavailable(_: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, Any]]:
    log.warning("backend unavailable: %s", exc)
    detail = str(exc) if isinstance(exc, SourceUnavailable) else "postgres unavailable"
    return Response(
        {"status_code": 503, "detail": f"{detail}; nothing was written, retry later"},
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


def exception_handlers() -> dict[type[Exception] | int, Callable[..., Response[Any]]]:
    return {
        InputError: _input_error,
        ConfigError: _input_error,
        SourceUnavailable: _unavailable,
        psycopg.OperationalError: _unavailable,
        psycopg_pool.PoolTimeout: _unavailable,
        HTTPException: _http,
        Exception: _internal,
    }
