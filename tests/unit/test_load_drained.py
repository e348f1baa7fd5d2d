"""benchmarks.load.run.wait_drained: with ``stall_s`` it waits as long as the
outbox keeps draining, and gives up only once it has stopped."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx

from benchmarks.load.run import wait_drained


def _health(counts: Iterator[int]) -> httpx.AsyncClient:
    """A client whose ``/health`` reports the next pending count each time."""

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/health"
        return httpx.Response(200, json={"backends": {"sync": {"pending": next(counts)}}})

    return httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://braid")


async def _wait(counts: Iterator[int], **kwargs: Any) -> dict[str, Any]:
    async with _health(counts) as client:
        return await wait_drained(client, **kwargs)


def test_a_draining_outbox_is_waited_for_past_the_timeout() -> None:
    # Eight readings at 0.25 s apart take longer than the stall allowance
    # of 0.6 s and the timeout of 0.1 s, but each is lower than the last.
    got = asyncio.run(_wait(iter([8, 7, 6, 5, 4, 3, 2, 1, 0]), timeout=0.1, stall_s=0.6))
    assert got["pending_left"] == 0
    assert float(got["seconds"]) >= 1.5


def test_a_stalled_outbox_ends_the_wait_with_what_is_left() -> None:
    got = asyncio.run(_wait(iter([9, 7] + [7] * 100), stall_s=0.6))
    assert got["pending_left"] == 7
    assert 0.6 <= float(got["seconds"]) < 2.0


def test_without_a_stall_allowance_the_timeout_bounds_the_wait() -> None:
    got = asyncio.run(_wait(iter(range(1000, 0, -1)), timeout=0.6, stall_s=None))
    assert got["pending_left"] not in (0, None)
    assert float(got["seconds"]) < 2.0
