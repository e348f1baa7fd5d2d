"""Two outbox workers (two service processes) never leave Typesense with an
older version of a memory than Postgres holds, against the real embedded
Postgres and Typesense. The fault injected: one worker's Typesense import
held until the other has drained."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping, Sequence

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
