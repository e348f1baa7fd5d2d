"""When and how long the client waits before sending a request again.

The waiting and counting is tenacity's; this module only decides what is
worth retrying and for how long (:class:`Retry`), and reads ``Retry-After``.

What is retried:

- ``429`` (rate limited): the service refused the request before reading it,
  so every request is retried, after ``Retry-After``.
- a connection that could not be made (nothing was sent): every request.
- ``503`` (a backend unavailable, or a write whose outcome is unknown), a
  read timeout and a dropped connection: only requests that are safe to send
  twice (``idempotent``): reads, recalls, memory writes (the client gives every
  memory an id, and a write with ids replaces), graph writes (upserts) and
  config reloads. Deletes and reindex starts are not: a repeat would answer
  404 or 409 after the first had worked.

Waits: the ``Retry-After`` the service sent (seconds or an HTTP date), with
up to 10% added so clients told the same second spread out; otherwise
exponential backoff with full jitter (a random wait between 0 and
``backoff_s * 2**(n-1)``, at most ``max_backoff_s``). It gives up after
``attempts`` sends, or when the next wait would end more than ``total_s``
after the first send, and raises the last error.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import msgspec
import tenacity

from .errors import BraidError, ConnectError, HTTPError, RateLimited, TransportError, Unavailable

__all__ = ["OnRetry", "Retry", "retry_after_seconds"]

#: Called before each wait: the error that caused it, the attempt that failed (1 = the first send), the wait in seconds.
OnRetry = Callable[[BraidError, int, float], None]


class Retry(msgspec.Struct, frozen=True, kw_only=True):
    """How often and how long to retry (see the module docstring for what)."""

    #: Sends in all, the first included; 1 = never retry.
    attempts: int = 4
    #: Longest time from the first send to the last retry's start, in seconds.
    total_s: float = 30.0
    #: First backoff ceiling (seconds) when the service sent no Retry-After.
    backoff_s: float = 0.5
    #: Largest backoff ceiling (seconds).
    max_backoff_s: float = 8.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("Retry.attempts must be at least 1")
        if self.total_s < 0 or self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError("Retry times must not be negative")


def retry_after_seconds(value: str | None, now: datetime | None = None) -> float | None:
    """``Retry-After`` in seconds: a number of seconds, or an HTTP date (the
    time until then, at least 0). None when absent or unreadable."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if seconds == seconds else None  # NaN: unreadable
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def should_retry(error: BaseException, idempotent: bool) -> bool:
    """Whether ``error`` is worth another send of a request (module docstring)."""
    if isinstance(error, RateLimited | ConnectError):
        return True
    if isinstance(error, Unavailable):
        return idempotent
    if isinstance(error, HTTPError):
        return False
    return isinstance(error, TransportError) and idempotent


def _wait(policy: Retry) -> Callable[[tenacity.RetryCallState], float]:
    backoff = tenacity.wait_random_exponential(multiplier=policy.backoff_s, max=policy.max_backoff_s)

    def wait(state: tenacity.RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome is not None else None
        asked = getattr(error, "retry_after", None)
        if isinstance(asked, float | int):
            return float(asked) * (1.0 + 0.1 * random.random())
        return float(backoff(state))

    return wait


def _before_sleep(on_retry: OnRetry | None) -> Callable[[tenacity.RetryCallState], None]:
    def before_sleep(state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        if on_retry is not None and isinstance(error, BraidError):
            on_retry(error, state.attempt_number, state.upcoming_sleep)

    return before_sleep


def retrying_kwargs(policy: Retry, idempotent: bool, on_retry: OnRetry | None) -> dict[str, Any]:
    """Arguments for tenacity's ``Retrying`` / ``AsyncRetrying``."""
    return {
        "stop": tenacity.stop_after_attempt(policy.attempts) | tenacity.stop_before_delay(policy.total_s),
        "wait": _wait(policy),
        "retry": tenacity.retry_if_exception(lambda e: should_retry(e, idempotent)),
        "before_sleep": _before_sleep(on_retry),
        "reraise": True,
    }
