"""Embedding lanes: queries and writes on their own worker threads, writes in
bounded jobs, abandoned jobs dropped or finished. The model is replaced by a
stand-in whose write inference can be held (a stalled inference, injected)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import anyio
import pytest

from indexers.embedding import Lane, MiniLMEmbedder

pytestmark = pytest.mark.anyio


class HeldModel(MiniLMEmbedder):
    """MiniLM's lanes and cache around a stand-in model: a text's vector is
    ``(len(text),)``; an inference of a text starting with ``hold`` waits for
    :attr:`release`. Records every inference's texts and thread."""

    def __init__(self, **kwargs: int) -> None:
        super().__init__(**kwargs)
        self.release = threading.Event()
        self.holding = threading.Event()
        self.calls: list[tuple[str, list[str]]] = []

    def _encode(self, texts: list[str]) -> list[tuple[float, ...]]:
        self.calls.append((threading.current_thread().name, list(texts)))
        if texts[0].startswith("hold"):
            self.holding.set()
            assert self.release.wait(10)
        return [(float(len(t)),) for t in texts]


async def wait_for(event: threading.Event) -> None:
    with anyio.fail_after(5):
        while not event.is_set():
            await anyio.sleep(0.001)


async def test_query_is_embedded_while_a_write_inference_is_held() -> None:
    model = HeldModel(write_batch=2)
    written: list[Sequence[tuple[float, ...]]] = []

    async def write() -> None:
        written.append(await model.embed(["hold-1", "b", "c"]))

    async with anyio.create_task_group() as tg:
        tg.start_soon(write)
        await wait_for(model.holding)
        with anyio.fail_after(5):
            assert await model.embed_query("the query") == (9.0,)
        assert written == []  # the write is still held
        model.release.set()
    assert written == [[(6.0,), (1.0,), (1.0,)]]
    assert model.calls == [
        ("braid-embed-write", ["hold-1", "b"]),
        ("braid-embed-query", ["the query"]),
        ("braid-embed-write", ["c"]),
    ]
    model.close()


async def test_concurrent_writes_take_turns_by_job() -> None:
    model = HeldModel(write_batch=2)
    done: list[str] = []

    async def write(name: str, texts: list[str]) -> None:
        await model.embed(texts)
        done.append(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(write, "big", ["hold", "b1", "b2", "b3", "b4", "b5"])
        await wait_for(model.holding)
        tg.start_soon(write, "small", ["s1"])
        await anyio.sleep(0.05)  # "small" queued behind big's first job
        model.release.set()
    assert [texts for _, texts in model.calls] == [["hold", "b1"], ["s1"], ["b2", "b3"], ["b4", "b5"]]
    assert done == ["small", "big"]
    model.close()


async def test_late_query_embedding_still_fills_the_cache() -> None:
    model = HeldModel()
    with anyio.move_on_after(0.05) as scope:
        await model.embed_query("hold the query")
    assert scope.cancelled_caught
    assert model.cache_stats == {"hits": 0, "misses": 1}
    model.release.set()
    with anyio.fail_after(5):
        while model.queries.ran < 1:
            await anyio.sleep(0.001)
    # Served from the cache: no second inference.
    assert await model.embed_query("hold the query") == (14.0,)
    assert model.cache_stats == {"hits": 1, "misses": 1}
    assert [texts for _, texts in model.calls] == [["hold the query"]]
    model.close()


async def test_job_abandoned_before_it_starts_is_dropped() -> None:
    lane = Lane("test")
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def job(name: str) -> str:
        if name == "first":
            started.set()
            assert release.wait(5)
        ran.append(name)
        return name

    async with anyio.create_task_group() as tg:
        tg.start_soon(lane.run, lambda: job("first"))
        await wait_for(started)
        with anyio.move_on_after(0.05):
            await lane.run(lambda: job("second"))
        release.set()
    assert await lane.run(lambda: job("third")) == "third"
    assert ran == ["first", "third"]
    assert (lane.ran, lane.dropped) == (2, 1)
    lane.close()


async def test_job_error_is_raised_to_its_caller_and_the_lane_goes_on() -> None:
    lane = Lane("test")

    def fails() -> None:
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="^bad input$"):
        await lane.run(fails)
    assert await lane.run(lambda: 42) == 42
    lane.close()


async def test_jobs_run_one_at_a_time_in_order_on_the_lane_thread() -> None:
    lane = Lane("ordered")
    active: list[int] = []
    seen: list[tuple[int, str, int]] = []

    def job(i: int) -> int:
        active.append(i)
        seen.append((i, threading.current_thread().name, len(active)))
        time.sleep(0.002)
        active.remove(i)
        return i

    results: list[int] = []

    async def run(i: int) -> None:
        results.append(await lane.run(lambda: job(i)))

    async with anyio.create_task_group() as tg:
        for i in range(5):
            tg.start_soon(run, i)
            await anyio.sleep(0)  # queued in this order
    assert seen == [(i, "braid-ordered", 1) for i in range(5)]
    assert sorted(results) == list(range(5))
    lane.close()


async def test_write_jobs_take_texts_longest_first_and_vectors_keep_the_given_order() -> None:
    model = HeldModel(write_batch=2)
    assert await model.embed(["a", "ccc", "bb", "dddd", "e"]) == [(1.0,), (3.0,), (2.0,), (4.0,), (1.0,)]
    assert [texts for _, texts in model.calls] == [["dddd", "ccc"], ["bb", "a"], ["e"]]
    assert await model.embed([]) == []
    model.close()
