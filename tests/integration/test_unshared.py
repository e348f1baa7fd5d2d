"""Small tenants' rows stay out of the tiers' shared HNSW indexes
(``indexers/postgres/unshared.py``), against the real embedded Postgres 18 +
pgvector 0.8: flagged on write while the tenant holds at most the tier's
``exactBelow`` rows, moved into the shared index a batch a write once it
holds more, found by every search either way, kept or set by the placement job."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
import numpy as np
import pytest
from psycopg_pool import AsyncConnectionPool

from config import BraidConfig, TierConfig
from deploy.embedded import EmbeddedPostgres
from indexers.base import Filters
from indexers.graph import _seeds_cte
from indexers.own_index import place_indexes
from indexers.pgvector import PgvectorSource, ensure_indexes
from indexers.postgres import EntityInput, PostgresStore, unshared
from indexers.postgres.pool import tenant_transaction
from indexers.postgres.sql import vector_param
from indexers.postgres.unshared import flag_rows

from .test_pgvector import exact_top, make_config, memory, open_test_pool, query, unit_vectors

pytestmark = pytest.mark.anyio

EXACT_BELOW = 50


def small_config(above: int | None = None) -> BraidConfig:
    tier = TierConfig(holds="memories", m=16, ef_construction=64, ef_search=200, exact_below=EXACT_BELOW)
    cfg = make_config(session=tier, rag=tier)
    return msgspec.structs.replace(cfg, postgres=msgspec.structs.replace(cfg.postgres, own_index_above=above))


LIMITS = {"session": EXACT_BELOW, "rag": EXACT_BELOW}


@pytest.fixture(scope="module")
async def pool(postgres: EmbeddedPostgres) -> AsyncIterator[AsyncConnectionPool]:
    pool = await open_test_pool(postgres)
    await ensure_indexes(pool, small_config())
    # A tenant past exactBelow from its first write: its rows are what the shared index holds.
    rng = np.random.default_rng(5)
    await PostgresStore(pool).write_memories(
        "whale", [memory(f"whale-{i}", v) for i, v in enumerate(unit_vectors(rng, 300))], exact_below=LIMITS
    )
    yield pool
    await pool.close()


async def flags(pool: AsyncConnectionPool, tenant: str) -> dict[str, bool]:
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT id, own FROM memories WHERE tenant = %s", (tenant,))
        return dict(await cur.fetchall())


async def search_ids(pool: AsyncConnectionPool, cfg: BraidConfig, tenant: str, vec: np.ndarray) -> list[str]:
    source = PgvectorSource(pool, lambda: cfg)
    hits = await source.search(query(tenant, vec, limit=10, filters=Filters(tiers=("session",))))
    return [h.id for h in hits]


async def test_a_small_tenants_rows_stay_out_of_the_shared_index_and_every_search_finds_them(
    pool: AsyncConnectionPool,
) -> None:
    rng = np.random.default_rng(1)
    vectors = unit_vectors(rng, EXACT_BELOW)
    ids = [f"minnow-{i}" for i in range(EXACT_BELOW)]
    store = PostgresStore(pool)
    await store.write_memories(
        "minnow", [memory(i, v) for i, v in zip(ids[:30], vectors[:30], strict=True)], exact_below=LIMITS
    )
    # Up to exactBelow rows counting the write: still small.
    await store.write_memories(
        "minnow", [memory(i, v) for i, v in zip(ids[30:], vectors[30:], strict=True)], exact_below=LIMITS
    )
    assert await flags(pool, "minnow") == dict.fromkeys(ids, True)
    assert not any((await flags(pool, "whale")).values())
    # The shared index leaves flagged rows out (its predicate), and the searches compare them exactly.
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'memories_hnsw_session'")
        row = await cur.fetchone()
    assert row is not None and "NOT own" in row[0]
    cfg = small_config()
    for k in range(5):
        q = vectors[k * 7]
        assert await search_ids(pool, cfg, "minnow", q) == exact_top(ids, vectors, q, 10)
    # Without exactBelow (a caller that passes none) the rows go into the shared index as before.
    await store.write_memories("other", [memory("other-1", vectors[0])])
    assert await flags(pool, "other") == {"other-1": False}


async def test_a_tenant_past_exact_below_moves_its_rows_in_a_batch_a_write_and_searches_find_them_throughout(
    pool: AsyncConnectionPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(unshared, "MOVE_BATCH", 20)
    rng = np.random.default_rng(2)
    vectors = unit_vectors(rng, 80)
    ids = [f"grower-{i}" for i in range(80)]
    store = PostgresStore(pool)
    cfg = small_config()

    async def write(lo: int, hi: int) -> None:
        batch = [memory(i, v) for i, v in zip(ids[lo:hi], vectors[lo:hi], strict=True)]
        await store.write_memories("grower", batch, exact_below=LIMITS)

    async def check(n: int) -> None:
        for k in range(0, n, 9):
            q = vectors[k]
            assert await search_ids(pool, cfg, "grower", q) == exact_top(ids[:n], vectors[:n], q, 10), (n, k)

    await write(0, 45)
    assert sum((await flags(pool, "grower")).values()) == 45
    # The write that takes it past exactBelow: its own rows unflagged, 20 earlier ones moved.
    await write(45, 60)
    state = await flags(pool, "grower")
    assert [state[i] for i in ids[45:60]] == [False] * 15
    assert sum(state.values()) == 25
    await check(60)  # 60 rows > exactBelow: the walk, and the flagged rows exactly beside it
    await write(60, 61)
    assert sum((await flags(pool, "grower")).values()) == 5
    await check(61)
    await write(61, 62)
    assert not any((await flags(pool, "grower")).values())
    await check(62)
    # A row flagged by a write that raced across the threshold is moved by the next write.
    async with pool.connection() as conn:
        await conn.execute("UPDATE memories SET own = true WHERE tenant = 'grower' AND id = ANY(%s)", (ids[:3],))
    await write(62, 63)
    assert not any((await flags(pool, "grower")).values())
    # A write in another tier moves nothing of this one.
    async with pool.connection() as conn:
        await conn.execute("UPDATE memories SET own = true WHERE tenant = 'grower' AND id = ANY(%s)", (ids[:3],))
    await store.write_memories("grower", [memory("grower-rag", vectors[70], tier="rag")], exact_below=LIMITS)
    state = await flags(pool, "grower")
    assert state["grower-rag"] is True and sum(state.values()) == 4


async def test_a_folded_row_is_never_flagged_small(pool: AsyncConnectionPool) -> None:
    rng = np.random.default_rng(3)
    written = [memory("f-1", unit_vectors(rng, 1)[0]), memory("f-2", unit_vectors(rng, 1)[0])]
    async with tenant_transaction(pool, "folder") as conn:
        got, move = await flag_rows(conn, "folder", written, [7, None], LIMITS)
    assert got == [False, True] and move == []
    async with tenant_transaction(pool, "whale") as conn:
        got, move = await flag_rows(conn, "whale", written[:1], [None], LIMITS)
        assert got == [False] and move == ["session"]
        # No exactBelow for the tier: nothing flagged, nothing moved.
        got, move = await flag_rows(conn, "whale", written[:1], [None], {})
        assert got == [False] and move == []


async def test_the_placement_job_flags_small_tenants_written_before_and_keeps_their_flags(
    pool: AsyncConnectionPool,
) -> None:
    rng = np.random.default_rng(4)
    vectors = unit_vectors(rng, 70)
    store = PostgresStore(pool)
    # Written the old way (no exactBelow given): in the shared index.
    await store.write_memories("early", [memory(f"early-{i}", v) for i, v in enumerate(vectors[:20])])
    await store.write_memories("late", [memory(f"late-{i}", v) for i, v in enumerate(vectors[:70])])
    async with pool.connection() as conn:  # a straggler of a tenant past exactBelow
        await conn.execute("UPDATE memories SET own = true WHERE tenant = 'late' AND id = 'late-0'")
    progress: dict[str, Any] = {}

    async def report(update: dict[str, Any]) -> None:
        for key, value in update.items():
            progress.setdefault(key, {}).update(value)

    for above in (None, 1000):
        await place_indexes(pool, small_config(above), report)
        assert set((await flags(pool, "early")).values()) == {True}
    # With a threshold the job also clears what a tenant past exactBelow should not have.
    assert not any((await flags(pool, "late")).values())
    assert progress["pgvector"]["indexes"] == []
    cfg = small_config()
    q = vectors[3]
    assert await search_ids(pool, cfg, "early", q) == exact_top([f"early-{i}" for i in range(20)], vectors[:20], q, 10)


# --- entities ------------------------------------------------------------------


async def entity_flags(pool: AsyncConnectionPool, tenant: str) -> dict[str, bool]:
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT name, small FROM entities WHERE tenant = %s", (tenant,))
        return dict(await cur.fetchall())


async def seeds(pool: AsyncConnectionPool, tenant: str, vec: np.ndarray, limit: int) -> list[str]:
    """The graph source's seed statement, vector seeds only: the nearest entities' names."""
    statement = f"WITH {_seeds_cte(True)} SELECT e.name FROM seeds JOIN entities e USING (id) ORDER BY weight DESC"
    params = {
        "tenant": tenant,
        "names": [],
        "vec": vector_param(tuple(map(float, vec))),
        "model": "synthetic",
        "limit": limit,
        "exact_below": EXACT_BELOW,
        "min_similarity": -1.0,
    }
    async with tenant_transaction(pool, tenant) as conn:
        await conn.execute("SET LOCAL hnsw.ef_search = 200")
        cur = await conn.execute(statement, params)
        return [name for (name,) in await cur.fetchall()]


async def test_a_small_tenants_entities_stay_out_of_the_index_and_move_in_once_it_grows(
    pool: AsyncConnectionPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(unshared, "MOVE_BATCH", 20)
    rng = np.random.default_rng(6)
    vectors = unit_vectors(rng, 70)
    names = [f"Entity {i}" for i in range(70)]
    store = PostgresStore(pool)

    def entities(lo: int, hi: int) -> list[EntityInput]:
        return [
            EntityInput(name=names[i], embedding=tuple(map(float, vectors[i])), model="synthetic")
            for i in range(lo, hi)
        ]

    # The index leaves flagged entities out.
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'entities_hnsw'")
        row = await cur.fetchone()
    assert row is not None and "NOT small" in row[0]
    # Another tenant past exactBelow: its entities are what the index holds.
    await store.write_graph("ewhale", entities(0, 70), [], entity_exact_below=0)
    assert not any((await entity_flags(pool, "ewhale")).values())

    await store.write_graph("eminnow", entities(0, 30), [], entity_exact_below=EXACT_BELOW)
    assert set((await entity_flags(pool, "eminnow")).values()) == {True}
    # A memory write's new entities, counted the same way: 30 + 15 <= 50.
    await store.write_memories(
        "eminnow", [memory("em-1", vectors[0])], entities(30, 45), entity_exact_below=EXACT_BELOW
    )
    assert sum((await entity_flags(pool, "eminnow")).values()) == 45
    for k in (0, 33, 44):
        assert await seeds(pool, "eminnow", vectors[k], 5) == exact_top(names[:45], vectors[:45], vectors[k], 5)
    # Past exactBelow: the new ones go in, 20 earlier ones move in, the rest are found beside the walk.
    await store.write_graph("eminnow", entities(45, 60), [], entity_exact_below=EXACT_BELOW)
    state = await entity_flags(pool, "eminnow")
    assert [state[n] for n in names[45:60]] == [False] * 15 and sum(state.values()) == 25
    for k in (0, 20, 50, 59):
        assert await seeds(pool, "eminnow", vectors[k], 5) == exact_top(names[:60], vectors[:60], vectors[k], 5)
    # A rewrite keeps an entity's flag; the next writes move the rest.
    flagged = next(n for n, small in state.items() if small)
    await store.write_graph(
        "eminnow", [e for e in entities(0, 60) if e.name == flagged], [], entity_exact_below=EXACT_BELOW
    )
    assert sum((await entity_flags(pool, "eminnow")).values()) == 5
    await store.write_graph("eminnow", entities(60, 61), [], entity_exact_below=EXACT_BELOW)
    assert not any((await entity_flags(pool, "eminnow")).values())
    assert await seeds(pool, "eminnow", vectors[3], 5) == exact_top(names[:61], vectors[:61], vectors[3], 5)
