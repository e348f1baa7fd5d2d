"""Two outbox workers (two service processes) never leave Typesense with an
older version of a memory than Postgres holds, against the real embedded
Postgres and Typesense. The fault injected: one worker's Typesense import
held until the other has drained."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import anyio
import pytest

from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense
from indexers.base import MemoryRecord
from indexers.postgres import PostgresStore, open_pool
from indexers.sync import OutboxSync
from indexers.typesense import TypesenseClient, TypesenseGroups
from tests.api.conftest import fresh_database
from tests.integration.test_postgres_store import DIM, memory

pytestmark = pytest.mark.anyio


class HeldImports:
    """A Typesense writer whose upserts wait for ``release`` (the fault)."""

    def __init__(self, index: TypesenseGroups) -> None:
        self.index = index
        self.called = anyio.Event()
        self.release = anyio.Event()

    async def upsert(self, records: Sequence[MemoryRecord], collections: Mapping[str, str] | None = None) -> None:
        self.called.set()
        await self.release.wait()
        await self.index.upsert(records, collections=collections)

    async def delete(self, keys: Sequence[tuple[str, str]], collections: Mapping[str, str] | None = None) -> None:
        await self.index.delete(keys, collections=collections)


@pytest.fixture
async def parts(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense
) -> AsyncIterator[tuple[str, PostgresStore, TypesenseGroups]]:
    dsn = fresh_database(postgres)
    pool = await open_pool(dsn, dim=DIM, min_size=1, max_size=6)
    client = TypesenseClient([typesense.url], typesense.api_key, timeout=5.0)
    index = TypesenseGroups(client, f"mem_{uuid.uuid4().hex[:12]}", DIM)
    await index.ensure()
    yield dsn, PostgresStore(pool), index
    await client.aclose()
    await pool.close()


async def pending(store: PostgresStore) -> list[str]:
    async with store.pool.connection() as conn:
        cur = await conn.execute("SELECT memory_id FROM outbox WHERE processed_at IS NULL ORDER BY id")
        return [r[0] for r in await cur.fetchall()]


async def test_a_rewrite_is_not_overtaken_by_the_older_version_another_worker_holds(
    parts: tuple[str, PostgresStore, TypesenseGroups],
) -> None:
    dsn, store, index = parts
    held = HeldImports(index)
    slow = OutboxSync(store, held, dsn=dsn)
    fast = OutboxSync(store, index, dsn=dsn)
    await store.write_memories("t", [memory("m1", "Sam lives in Lisbon"), memory("m2", "Ana likes tea")])
    async with anyio.create_task_group() as tg:
        tg.start_soon(slow.drain_once)
        with anyio.fail_after(10):
            await held.called.wait()  # the slow worker holds both rows, m1 read as "Lisbon"
        await store.write_memories("t", [memory("m1", "Sam lives in Porto"), memory("m3", "Bo plays chess")])
        # The other worker takes what it can: m3, not m1's rewrite while the
        # older version is still on its way.
        assert await fast.drain_once() == 1
        assert await pending(store) == ["m1", "m2", "m1"]
        held.release.set()
    assert await pending(store) == ["m1"]
    assert await fast.drain_once() == 1
    assert await pending(store) == []
    docs = {m: await index.fetch(m, tenant="t") for m in ("m1", "m2", "m3")}
    assert {m: d["content"] if d else None for m, d in docs.items()} == {
        "m1": "Sam lives in Porto",
        "m2": "Ana likes tea",
        "m3": "Bo plays chess",
    }


async def test_one_worker_applies_every_pending_row_of_a_memory_in_one_batch(
    parts: tuple[str, PostgresStore, TypesenseGroups],
) -> None:
    dsn, store, index = parts
    for n in range(5):
        await store.write_memories("t", [memory("m1", f"version {n}"), memory(f"other{n}", "another memory")])
    worker = OutboxSync(store, index, dsn=dsn)
    assert await worker.drain_once() == 10
    assert await pending(store) == []
    doc = await index.fetch("m1", tenant="t")
    assert doc is not None and doc["content"] == "version 4"


class CountedSync(OutboxSync):
    """Records its claims (each ``drain_once`` is one claim transaction):
    when each began and ended, and how many rows it took."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.claims: list[tuple[float, float, int]] = []

    async def drain_once(self) -> int:
        start = anyio.current_time()
        n = await super().drain_once()
        self.claims.append((start, anyio.current_time(), n))
        return n


class Recorded:
    """A Typesense writer that records which memories it upserted."""

    def __init__(self, index: TypesenseGroups) -> None:
        self.index = index
        self.upserted: list[str] = []

    async def upsert(self, records: Sequence[MemoryRecord], collections: Mapping[str, str] | None = None) -> None:
        await self.index.upsert(records, collections=collections)
        self.upserted += [r.id for r in records]

    async def delete(self, keys: Sequence[tuple[str, str]], collections: Mapping[str, str] | None = None) -> None:
        await self.index.delete(keys, collections=collections)


async def test_a_short_batch_is_not_followed_by_a_claim_that_finds_the_outbox_empty(
    parts: tuple[str, PostgresStore, TypesenseGroups],
) -> None:
    """After a batch shorter than the batch size the worker waits for a
    notification (or its 1 s poll) instead of claiming again at once to find
    nothing; each write still lands by its own notification."""
    dsn, store, index = parts
    writer = Recorded(index)
    sync = CountedSync(store, writer, dsn=dsn)
    async with anyio.create_task_group() as tg:
        tg.start_soon(sync.run)
        with anyio.fail_after(10):
            while not sync.claims:  # started: the outbox found empty
                await anyio.sleep(0.01)
        await anyio.sleep(0.2)  # the listener is connected
        for i in range(3):
            await store.write_memories("t", [memory(f"m{i}", f"note {i}")])
            with anyio.fail_after(10):
                while len(writer.upserted) < i + 1:
                    await anyio.sleep(0.01)
            await anyio.sleep(0.3)
        tg.cancel_scope.cancel()
    assert writer.upserted == ["m0", "m1", "m2"]
    assert [n for _, _, n in sync.claims if n] == [1, 1, 1]
    for (_, ended, n), (began, _, m) in zip(sync.claims, sync.claims[1:], strict=False):
        if 0 < n:
            # Only the poll (1 s) could start an empty claim this soon after.
            assert m > 0 or began - ended > 0.9, sync.claims


async def one_pending(parts: tuple[str, PostgresStore, TypesenseGroups]) -> tuple[HeldImports, OutboxSync]:
    """A memory written, and an outbox loop whose imports are held."""
    dsn, store, index = parts
    held = HeldImports(index)
    await store.write_memories("t", [memory("m1", "Sam lives in Lisbon")])
    return held, OutboxSync(store, held, dsn=dsn)


async def test_a_stop_lets_the_batch_in_hand_finish_and_ends_the_loop(
    parts: tuple[str, PostgresStore, TypesenseGroups],
) -> None:
    _, store, index = parts
    held, sync = await one_pending(parts)
    async with anyio.create_task_group() as tg:
        tg.start_soon(sync.run)
        with anyio.fail_after(10):
            await held.called.wait()  # the loop holds m1, its import not yet sent
        stopping = anyio.Event()
        stopped: list[bool] = []

        async def stop() -> None:
            stopping.set()
            stopped.append(await sync.stop(timeout=10))

        tg.start_soon(stop)
        await stopping.wait()
        await anyio.sleep(0.2)
        assert not stopped, "the stop waits for the batch in hand"
        held.release.set()
    # The batch was imported and committed, and run() returned by itself (the
    # task group ended without a cancel).
    assert stopped == [True]
    assert await pending(store) == []
    assert await index.count("t") == 1
    # A write after the stop stays pending for the next start.
    await store.write_memories("t", [memory("m2", "Ana likes tea")])
    assert await pending(store) == ["m2"]


async def test_a_stop_gives_up_after_its_timeout(parts: tuple[str, PostgresStore, TypesenseGroups]) -> None:
    held, sync = await one_pending(parts)
    async with anyio.create_task_group() as tg:
        tg.start_soon(sync.run)
        with anyio.fail_after(10):
            await held.called.wait()
        assert await sync.stop(timeout=0.2) is False
        # Still stopping: once the import is let go, the batch commits and
        # the loop ends by itself (a cancel here would cut the batch inside
        # its pipeline, which psycopg reports as an unraisable exception).
        assert await pending(parts[1]) == ["m1"]
        held.release.set()
        assert await sync.stop(timeout=10) is True
    assert await pending(parts[1]) == []


class HeldFor(HeldImports):
    """Holds only the upserts that carry memory ``held`` (the fault); the others pass."""

    def __init__(self, index: TypesenseGroups, held: str) -> None:
        super().__init__(index)
        self.held = held

    async def upsert(self, records: Sequence[MemoryRecord], collections: Mapping[str, str] | None = None) -> None:
        if any(r.id == self.held for r in records):
            await super().upsert(records, collections)
        else:
            await self.index.upsert(records, collections=collections)


async def test_with_two_workers_a_held_batch_holds_back_neither_later_writes_nor_the_order(
    parts: tuple[str, PostgresStore, TypesenseGroups],
) -> None:
    dsn, store, index = parts
    held = HeldFor(index, "m1")
    sync = OutboxSync(store, held, dsn=dsn, workers=2)
    await store.write_memories("t", [memory("m1", "Sam lives in Lisbon")])
    async with anyio.create_task_group() as tg:
        tg.start_soon(sync.run)
        with anyio.fail_after(10):
            await held.called.wait()  # one worker holds m1 on its way to Typesense
        await store.write_memories("t", [memory("m2", "Ana likes tea")])
        with anyio.fail_after(10):
            while await index.fetch("m2", tenant="t") is None:  # the other worker
                await anyio.sleep(0.02)
        # m1's rewrite waits for the batch holding the older version.
        await store.write_memories("t", [memory("m1", "Sam lives in Porto")])
        await anyio.sleep(0.5)
        assert await pending(store) == ["m1", "m1"]
        held.release.set()
        with anyio.fail_after(10):
            while await pending(store):
                await anyio.sleep(0.02)
        assert await sync.stop(timeout=10) is True
    doc = await index.fetch("m1", tenant="t")
    assert doc is not None and doc["content"] == "Sam lives in Porto"
    assert sync.applied == 3
