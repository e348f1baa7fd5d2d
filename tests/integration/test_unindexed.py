"""The memories Typesense has not indexed yet, read from the real Postgres:
those with a pending outbox ``upsert``, as stored now, under the recall's
filters and the tenant's row-level security."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from deploy.embedded import EmbeddedPostgres
from indexers.base import Filters
from indexers.postgres import PostgresStore, open_pool
from tests.api.conftest import fresh_database
from tests.integration.test_postgres_store import DIM, memory

pytestmark = pytest.mark.anyio

TIERS = ("session", "rag")


@pytest.fixture
async def store(postgres: EmbeddedPostgres) -> AsyncIterator[PostgresStore]:
    pool = await open_pool(fresh_database(postgres), dim=DIM, min_size=1, max_size=4)
    yield PostgresStore(pool)
    await pool.close()


async def applied(store: PostgresStore) -> None:
    """What the outbox worker does once Typesense has a write."""
    async with store.pool.connection() as conn:
        await conn.execute("UPDATE outbox SET processed_at = now() WHERE processed_at IS NULL")


async def unindexed(
    store: PostgresStore, tenant: str = "t", filters: Filters = Filters(), limit: int = 256
) -> list[str]:
    records = await store.unindexed(tenant, filters, min_confidence=0.5, memory_tiers=TIERS, limit=limit)
    return [r.id for r in records]


async def test_only_memories_whose_outbox_rows_are_pending(store: PostgresStore) -> None:
    await store.write_memories("t", [memory("old", "indexed already")])
    await applied(store)
    assert await unindexed(store) == []
    await store.write_memories("t", [memory("new", "not yet"), memory("old", "rewritten since")])
    records = await store.unindexed("t", Filters(), min_confidence=0.5, memory_tiers=TIERS, limit=256)
    assert [(r.id, r.content) for r in records] == [("new", "not yet"), ("old", "rewritten since")]
    assert records[0].embedding is not None and len(records[0].embedding) == DIM
    assert records[0].tenant == "t"
    light = await store.unindexed("t", Filters(), min_confidence=0.5, memory_tiers=TIERS, limit=256, embeddings=False)
    assert [(r.id, r.content, r.embedding, r.model) for r in light] == [
        ("new", "not yet", None, "synthetic"),
        ("old", "rewritten since", None, "synthetic"),
    ]


async def test_the_recall_filters_and_the_tenant_apply(store: PostgresStore) -> None:
    await store.write_memories(
        "t",
        [
            memory("s1", "in session one", session_id="s-1"),
            memory("s2", "in session two", session_id="s-2"),
            memory("unsure", "low confidence", confidence=0.2),
            memory("rag", "another tier", tier="rag"),
        ],
    )
    await store.write_memories("other", [memory("theirs", "another tenant's")])
    assert await unindexed(store) == ["rag", "s1", "s2"]
    assert await unindexed(store, filters=Filters(session_id="s-2")) == ["s2"]
    assert await unindexed(store, filters=Filters(tiers=("session",))) == ["s1", "s2"]
    assert await unindexed(store, "other") == ["theirs"]


async def test_a_deleted_or_superseded_memory_is_not_unindexed(store: PostgresStore) -> None:
    await store.write_memories("t", [memory("gone", "to be deleted"), memory("v1", "Sam lives in Lisbon", mem_key="k")])
    await store.delete_memory("t", "gone")
    later = datetime(2025, 1, 1, tzinfo=UTC)
    await store.write_memories("t", [memory("v2", "Sam lives in Porto", mem_key="k", created_at=later)])
    assert await unindexed(store) == ["v2"]
    assert await unindexed(store, filters=Filters(as_of=datetime(2024, 6, 1, tzinfo=UTC))) == ["v1"]


async def test_the_newest_pending_rows_up_to_the_limit(store: PostgresStore) -> None:
    for i in range(5):
        await store.write_memories("t", [memory(f"m{i}", f"memory {i}")])
    assert await unindexed(store, limit=2) == ["m3", "m4"]
