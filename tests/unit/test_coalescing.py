"""Coalescing: requests queued while the lane is busy run in one call, each
answered with exactly its own items' results; a failing call is retried per
request; an abandoned request is never run. The lane is held by a job that
waits on an event (injected), so what queues behind it is known."""

from __future__ import annotations

import threading

import anyio
import pytest

from indexers.embedding import Coalescing, Lane

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


async def hold(lane: Lane, release: threading.Event, holding: threading.Event) -> None:
    def held() -> None:
        holding.set()
        assert release.wait(10)

    await lane.run(held)


async def wait_for(event: threading.Event) -> None:
    with anyio.fail_after(5):
        while not event.is_set():
            await anyio.sleep(0.001)


async def settle() -> None:
    """Let the tasks started so far queue their requests."""
    for _ in range(20):
        await anyio.sleep(0)


async def test_requests_queued_behind_a_busy_lane_run_in_one_call_each_with_its_own_results() -> None:
    lane = Lane("test")
    fn = Upper()
    batches = Coalescing(lane, fn, max_items=100)
    release, holding = threading.Event(), threading.Event()
    got: dict[int, list[str]] = {}

    async def ask(i: int, items: list[str]) -> None:
        got[i] = await batches.run(items)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(hold, lane, release, holding)
            await wait_for(holding)
            for i in range(5):
                tg.start_soon(ask, i, [f"r{i}-a", f"r{i}-b"][: 1 + i % 2])
            await settle()
            release.set()
        assert got == {i: [f"R{i}-A", f"R{i}-B"][: 1 + i % 2] for i in range(5)}
        assert len(fn.calls) == 1
        assert sorted(fn.calls[0]) == sorted(item for i in range(5) for item in [f"r{i}-a", f"r{i}-b"][: 1 + i % 2])
        assert (batches.calls, batches.requests) == (1, 5)
    finally:
        await anyio.to_thread.run_sync(lane.close)


async def test_a_call_takes_at_most_max_items_and_never_splits_a_request() -> None:
    lane = Lane("test")
    fn = Upper()
    batches = Coalescing(lane, fn, max_items=3)
    release, holding = threading.Event(), threading.Event()
    got: dict[int, list[str]] = {}

    async def ask(i: int, items: list[str]) -> None:
        got[i] = await batches.run(items)

    requests = {0: ["a", "b"], 1: ["c", "d"], 2: ["e", "f", "g", "h"], 3: ["i"]}
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(hold, lane, release, holding)
            await wait_for(holding)
            for i, items in requests.items():
                tg.start_soon(ask, i, items)
                await settle()  # queued in this order
            release.set()
        assert got == {i: [x.upper() for x in items] for i, items in requests.items()}
        # First come first served; a request over the limit goes alone.
        assert fn.calls == [["a", "b"], ["c", "d"], ["e", "f", "g", "h"], ["i"]]
    finally:
        await anyio.to_thread.run_sync(lane.close)


async def test_a_failing_call_is_retried_per_request_so_only_the_bad_one_fails() -> None:
    lane = Lane("test")
    fn = Upper()
    batches = Coalescing(lane, fn, max_items=100)
    release, holding = threading.Event(), threading.Event()
    got: dict[str, list[str] | Exception] = {}

    async def ask(items: list[str]) -> None:
        try:
            got[items[0]] = await batches.run(items)
        except ValueError as exc:
            got[items[0]] = exc

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(hold, lane, release, holding)
            await wait_for(holding)
            for items in (["x"], ["bad"], ["y", "z"]):
                tg.start_soon(ask, items)
            await settle()
            release.set()
        assert got["x"] == ["X"] and got["y"] == ["Y", "Z"]
        assert isinstance(got["bad"], ValueError)
        # One call for all three, then each alone.
        assert len(fn.calls) == 4 and sorted(map(tuple, fn.calls[1:])) == [("bad",), ("x",), ("y", "z")]
        assert (batches.calls, batches.requests) == (2, 2)
        assert await batches.run(["w"]) == ["W"]  # the lane goes on
    finally:
        await anyio.to_thread.run_sync(lane.close)


async def test_a_request_abandoned_while_queued_is_never_run() -> None:
    lane = Lane("test")
    fn = Upper()
    batches = Coalescing(lane, fn, max_items=100)
    release, holding = threading.Event(), threading.Event()
    got: list[list[str]] = []

    async def ask(items: list[str]) -> None:
        got.append(await batches.run(items))

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(hold, lane, release, holding)
            await wait_for(holding)
            with anyio.move_on_after(0.05):
                await batches.run(["gone"])
            tg.start_soon(ask, ["kept"])
            await settle()
            release.set()
        assert got == [["KEPT"]]
        assert fn.calls == [["kept"]]
    finally:
        await anyio.to_thread.run_sync(lane.close)
