"""Breadth must not outvote relevance (issue 17), through the HTTP API against
the real Postgres, Typesense and model: each source returns only what it
matched, and a memory written a moment ago ranks by its relevance while
Typesense has not indexed it yet (its outbox row pending)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import psycopg
import pytest

from config import BraidConfig
from indexers.base import BackendError, MemoryRecord
from indexers.engine import Engine

from . import conftest
from .conftest import Braid, make_app, patient, serve

pytestmark = pytest.mark.anyio

TURNS = [{"id": f"turn-{i}", "content": f"Turn number {i} of the chat"} for i in range(1, 7)]
TEA = {"id": "tea", "content": "Favourite tea blend is Earl Grey"}


class Stalled:
    """A Typesense writer that refuses everything: the outbox stays pending."""

    async def upsert(self, records: Sequence[MemoryRecord], collections: Mapping[str, str] | None = None) -> None:
        raise BackendError("stalled for the test")

    async def delete(self, keys: Sequence[tuple[str, str]], collections: Mapping[str, str] | None = None) -> None:
        raise BackendError("stalled for the test")


@asynccontextmanager
async def lagging(braid: Braid) -> AsyncIterator[None]:
    """Typesense indexes nothing written inside the block (the outbox worker's
    writes fail and stay pending); on leaving, everything is applied."""
    sync = braid.runtime.sync
    writer, sync._index = sync._index, Stalled()
    try:
        yield
    finally:
        sync._index = writer
    await braid.synced(timeout=30)


async def until_refused(braid: Braid) -> None:
    """Wait until the outbox worker has tried, and failed, to apply a write."""
    sync = braid.runtime.sync
    with anyio.fail_after(10):
        while sync.last_error is None:
            await anyio.sleep(0.01)
    assert await sync.pending() > 0


@asynccontextmanager
async def app_with(postgres: Any, typesense: Any, embedder: Any, cfg: BraidConfig) -> AsyncIterator[Braid]:
    app, dsn, alias = make_app(postgres, typesense, embedder, patient(cfg))
    async with serve(app) as client:
        yield Braid(client=client, app=app, dsn=dsn, alias=alias)


def order(out: dict[str, Any]) -> list[tuple[str, dict[str, int | None]]]:
    return [(i["id"], i["ranks"]) for i in out["items"]]


@pytest.mark.parametrize("vector_search", ["alone", "always"])
async def test_a_memory_written_a_moment_ago_is_first_when_it_is_the_match(
    postgres: Any, typesense: Any, embedder: Any, vector_search: str
) -> None:
    """The issue's example: six "Turn number i of the chat", then the tea
    memory; a recall right after the write, before Typesense has it, ranks
    it first. With ``vectorSearch: always`` Typesense's vector list used to
    hold the six turns (ranks 1-5, the tea memory not indexed yet) and
    pgvector's too (2-6): found by two sources, they outranked it."""
    cfg = conftest.test_config("unused").with_source("typesense", vector_search=vector_search)
    async with app_with(postgres, typesense, embedder, cfg) as braid:
        await braid.remember(*TURNS)
        await braid.synced()
        async with lagging(braid):
            await braid.remember(TEA)
            await until_refused(braid)
            out = await braid.recall("favourite tea blend", top_k=5)
        assert out["degraded"] == []
        assert out["items"][0]["id"] == "tea"
        # Typesense ranks it as it will once the outbox has applied it...
        assert out["items"][0]["ranks"]["typesense"] == 1
        assert out["items"][0]["ranks"]["pgvector"] == 1
        # ...and no turn is returned: none of them matched the query.
        assert [i["id"] for i in out["items"]] == ["tea"]
        assert out["sources"]["pgvector"]["hits"] == 1
        assert out["sources"]["typesense"]["hits"] == 1
        # Once Typesense has it, the same answer.
        assert order(await braid.recall("favourite tea blend", top_k=5)) == order(out)


async def test_a_fresh_memory_is_not_outranked_for_being_found_by_fewer_indexes(braid: Braid) -> None:
    """Typesense not having a memory yet is not Typesense not matching it:
    the newer, closer memory ranks as it will once indexed, above an older
    one both sources have."""
    older = {"id": "older", "content": "Earl Grey is a black tea blend flavoured with bergamot"}
    newer = {"id": "newer", "content": "My favourite tea blend is Earl Grey"}
    await braid.remember(older, *TURNS)
    await braid.synced()
    async with lagging(braid):
        await braid.remember(newer)
        await until_refused(braid)
        lagged = await braid.recall("my favourite tea blend", top_k=5)
    assert [i["id"] for i in lagged["items"][:2]] == ["newer", "older"]
    assert lagged["items"][0]["ranks"]["typesense"] == 1
    caught_up = await braid.recall("my favourite tea blend", top_k=5)
    assert order(caught_up) == order(lagged)


async def test_typesense_ranks_a_rewritten_memory_by_what_it_says_now(braid: Braid) -> None:
    """A memory rewritten while its old document is still in Typesense is
    ranked by its new text: the old words no longer find it, the new ones do."""
    await braid.remember({"id": "m1", "content": "The meeting is in the Kestrel suite"}, *TURNS)
    await braid.synced()
    async with lagging(braid):
        await braid.remember({"id": "m1", "content": "The meeting moved to the Heron hall"})
        await until_refused(braid)
        old = await braid.recall("Kestrel suite", sources=["typesense"], strategy="keyword")
        new = await braid.recall("Heron hall", sources=["typesense"], strategy="keyword")
    assert old["items"] == []
    assert [(i["id"], i["content"]) for i in new["items"]] == [("m1", "The meeting moved to the Heron hall")]


async def test_a_memory_outside_the_filters_stays_out_while_unindexed(braid: Braid) -> None:
    await braid.remember(*TURNS)
    await braid.synced()
    async with lagging(braid):
        await braid.remember({**TEA, "session_id": "s-2"})
        await until_refused(braid)
        other = await braid.recall("favourite tea blend", sources=["typesense"], session_id="s-1", strategy="keyword")
        own = await braid.recall("favourite tea blend", sources=["typesense"], session_id="s-2", strategy="keyword")
    assert other["items"] == []
    assert [i["id"] for i in own["items"]] == ["tea"]


async def test_without_the_outbox_read_the_recall_still_answers(braid: Braid, caplog: Any) -> None:
    """Postgres failing the read of unindexed memories: Typesense ranks what
    it has, nothing is degraded, the failure is logged."""
    await braid.remember(*TURNS)
    await braid.synced()
    engine: Engine = braid.runtime.engine

    async def fails(*_: Any, **__: Any) -> list[MemoryRecord]:
        raise psycopg.OperationalError("refused by the test")

    engine.store.unindexed = fails  # type: ignore[method-assign]
    async with lagging(braid):
        await braid.remember(TEA)
        await until_refused(braid)
        out = await braid.recall("favourite tea blend")
    assert out["degraded"] == []
    assert [(i["id"], i["ranks"]["typesense"]) for i in out["items"]] == [("tea", None)]
    assert "memories not yet indexed unavailable, this recall ranks without them: refused by the test" in caplog.text


async def test_a_slow_outbox_read_is_logged_with_its_deadline(braid: Braid, caplog: Any) -> None:
    """Postgres not answering the read of unindexed memories within
    ``query.speakerLookupMs``: the recall goes on, and the log says which
    deadline passed (a deadline's exception has no message of its own)."""
    await braid.remember(*TURNS)
    await braid.synced()
    engine: Engine = braid.runtime.engine
    deadline_ms = engine.config.current.query.speaker_lookup_ms

    async def hangs(*_: Any, **__: Any) -> list[MemoryRecord]:
        await anyio.sleep(30)
        return []

    engine.store.unindexed = hangs  # type: ignore[method-assign]
    out = await braid.recall("favourite tea blend")
    assert out["degraded"] == []
    line = f"memories not yet indexed unavailable, this recall ranks without them: no answer within {deadline_ms:g} ms"
    assert line in caplog.text


async def test_each_source_returns_only_what_it_matched(braid: Braid) -> None:
    """In a small tenant no source lists every memory: pgvector keeps the
    memories near the query, Typesense those holding its rare words, the
    graph those reached from entities the query matches."""
    await braid.remember(
        {"id": "alex", "content": "Alex drives a red Mazda MX-5", "entities": ["Alex", "Mazda"]},
        {"id": "sam", "content": "Sam plays the cello in an orchestra", "entities": ["Sam"]},
        *TURNS,
    )
    await braid.synced()
    for sources in (["typesense"], ["pgvector"], ["graph"]):
        out = await braid.recall("what car does Alex drive", sources=sources)
        assert [i["id"] for i in out["items"]] == ["alex"], sources


async def test_typesense_searches_while_the_unindexed_memories_are_read(
    braid: Braid, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Typesense's search does not wait for the read of the memories it does
    not have yet: that read (held here until the search has gone out) and
    the search overlap, and the fresh memory still takes its place once the
    read is back."""
    await braid.remember(*TURNS)
    await braid.synced()
    engine = braid.runtime.engine
    events: list[str] = []
    sent = anyio.Event()
    read = engine.store.unindexed

    async def held_read(*args: Any, **kwargs: Any) -> Any:
        await sent.wait()
        rows = await read(*args, **kwargs)
        events.append("unindexed read")
        return rows

    client = engine.sources["typesense"].client  # type: ignore[attr-defined]
    search = client.multi_search

    async def searched(searches: Any) -> Any:
        events.append("typesense search")
        sent.set()
        return await search(searches)

    monkeypatch.setattr(engine.store, "unindexed", held_read)
    monkeypatch.setattr(client, "multi_search", searched)
    async with lagging(braid):
        await braid.remember(TEA)
        await until_refused(braid)
        out = await braid.recall("favourite tea blend", top_k=5, sources=["typesense"], strategy="keyword")
    assert events == ["typesense search", "unindexed read"]
    assert [i["id"] for i in out["items"]] == ["tea"]
    assert out["items"][0]["ranks"]["typesense"] == 1
