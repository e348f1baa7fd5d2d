"""Coalescing: requests queued while the lane is busy run in one call, each
answered with exactly its own items' results; a failing call is retried per
request; an abandoned request is never run. The lane is held by a job that
waits on an event (injected), so what queues behind it is known."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest

from indexers.embedding import Coalescing, Lane

from .lanes import lane_held, settle

pytestmark = pytest.mark.anyio


class Upper:
    """The batch function: upper-cases each item, records every call's items,
    and fails any call holding ``"bad"``."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, items: list[str]) -> list[str]:
        self.calls.append(list(items))
        if "bad" in items:
            raise ValueError("bad item")
        return [item.upper() for item in items]


async def queued(batches: Coalescing[str, str], requests: list[list[str]]) -> list[list[str] | Exception]:
    """Each request's answer (or the ``ValueError`` it raised), the requests
    queued in this order while the lane is held, which is then let go."""
    got: dict[int, list[str] | Exception] = {}

    async def ask(i: int) -> None:
        try:
            got[i] = await batches.run(requests[i])
        except ValueError as exc:
            got[i] = exc

    async with anyio.create_task_group() as tg, lane_held(batches.lane):
        for i in range(len(requests)):
            tg.start_soon(ask, i)
            await settle()  # queued before the next one starts
    return [got[i] for i in range(len(requests))]


@pytest.fixture
async def lane() -> AsyncIterator[Lane]:
    lane = Lane("test")
    yield lane
    await anyio.to_thread.run_sync(lane.close)


async def test_requests_queued_behind_a_busy_lane_run_in_one_call_each_with_its_own_results(lane: Lane) -> None:
    fn = Upper()
    batches = Coalescing(lane, fn, max_items=100)
    requests = [[f"r{i}-a", f"r{i}-b"][: 1 + i % 2] for i in range(5)]
    assert await queued(batches, requests) == [[x.upper() for x in items] for items in requests]
    assert fn.calls == [[x for items in requests for x in items]]
    assert (batches.calls, batches.requests) == (1, 5)


async def test_a_call_takes_at_most_max_items_and_never_splits_a_request(lane: Lane) -> None:
    fn = Upper()
    batches = Coalescing(lane, fn, max_items=3)
    requests = [["a", "b"], ["c", "d"], ["e", "f", "g", "h"], ["i"]]
    assert await queued(batches, requests) == [[x.upper() for x in items] for items in requests]
    # First come first served; a request over the limit goes alone.
    assert fn.calls == requests


async def test_a_failing_call_is_retried_per_request_so_only_the_bad_one_fails(lane: Lane) -> None:
    fn = Upper()
    batches = Coalescing(lane, fn, max_items=100)
    x, bad, yz = await queued(batches, [["x"], ["bad"], ["y", "z"]])
    assert (x, yz) == (["X"], ["Y", "Z"])
    assert isinstance(bad, ValueError)
    # One call for all three, then each alone.
    assert fn.calls == [["x", "bad", "y", "z"], ["x"], ["bad"], ["y", "z"]]
    assert (batches.calls, batches.requests) == (2, 2)
    assert await batches.run(["w"]) == ["W"]  # the lane goes on


class Stop(BaseException):
    """Not an ``Exception``: no request's items caused it."""


async def test_a_call_stopped_by_a_base_exception_is_not_retried_and_every_request_gets_it(lane: Lane) -> None:
    calls: list[list[str]] = []

    def stop(items: list[str]) -> list[str]:
        calls.append(list(items))
        raise Stop

    batches = Coalescing(lane, stop, max_items=100)
    got: list[BaseException] = []

    async def ask(items: list[str]) -> None:
        try:
            await batches.run(items)
        except Stop as exc:
            got.append(exc)

    async with anyio.create_task_group() as tg, lane_held(batches.lane):
        tg.start_soon(ask, ["x"])
        await settle()
        tg.start_soon(ask, ["y", "z"])
        await settle()
    assert calls == [["x", "y", "z"]]
    assert len(got) == 2 and got[0] is got[1]
    assert batches.calls == 0


async def test_a_request_abandoned_while_queued_is_never_run(lane: Lane) -> None:
    fn = Upper()
    batches = Coalescing(lane, fn, max_items=100)
    async with lane_held(lane):
        with anyio.move_on_after(0.05):
            await batches.run(["gone"])
    assert await batches.run(["kept"]) == ["KEPT"]
    assert fn.calls == [["kept"]]
