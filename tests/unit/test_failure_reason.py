"""What a failed backend step's log line and replica status say (:func:`indexers.base.failure_reason`)."""

from __future__ import annotations

import anyio
import psycopg
import pytest
from psycopg_pool import PoolTimeout

from indexers.base import failure_reason


async def _deadline_error(seconds: float) -> TimeoutError:
    try:
        with anyio.fail_after(seconds):
            await anyio.sleep(10)
    except TimeoutError as exc:
        return exc
    raise AssertionError("the deadline did not pass")


@pytest.mark.anyio
async def test_a_deadline_names_itself() -> None:
    exc = await _deadline_error(0.01)
    assert str(exc) == ""  # why the helper exists
    assert failure_reason(exc, 0.2) == "no answer within 200 ms"
    assert failure_reason(exc, 10.0) == "no answer within 10000 ms"
    assert failure_reason(exc) == "timed out"


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (TimeoutError("the node took too long"), "the node took too long"),
        (psycopg.OperationalError("connection refused\n"), "connection refused"),
        (PoolTimeout("couldn't get a connection after 5.00 sec"), "couldn't get a connection after 5.00 sec"),
        (ValueError(), "ValueError"),
    ],
)
def test_other_errors_read_as_their_message_or_class(exc: BaseException, reason: str) -> None:
    assert failure_reason(exc, 0.2) == reason
