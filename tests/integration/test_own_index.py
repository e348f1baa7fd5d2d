"""Large tenants' own HNSW indexes (``indexers/own_index.py``) against the
real embedded Postgres 18 + pgvector 0.8: built by the placement step, walked
by the pgvector source, rebuilt by a tier reindex, dropped when the tenant
shrinks. Vectors as in ``test_pgvector.py``: seeded, 16-d, unit length."""

from __future__ import annotations

import math
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import numpy as np
import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from config import BraidConfig, TierConfig
from deploy.embedded import EmbeddedPostgres
from indexers.base import Filters
from indexers.own_index import own_index_name, own_indexes, place_indexes
from indexers.pgvector import PgvectorSource, ensure_indexes, index_params, rebuild_index, set_search_params
from indexers.postgres import PostgresStore

from .test_pgvector import exact_top, make_config, memory, open_test_pool, query, recording_pool, unit_vectors

pytestmark = pytest.mark.anyio

#: A tenant whose name needs quoting in SQL, and holds a `%` (a placeholder to psycopg).
ODD = "pike's 100%"
SIZES = {"whale": (1500, 600), ODD: (1200, 0), "minnow": (300, 300)}  # (session, rag) memories


def placing(above: int | None, m: int = 16, most: int = 50, exact_below: int = 200) -> BraidConfig:
    tier = TierConfig(holds="memories", m=m, ef_construction=64, ef_search=40, exact_below=exact_below)
    cfg = make_config(session=tier, rag=tier)
    postgres = msgspec.structs.replace(cfg.postgres, own_index_above=above, own_indexes_max=most)
    return msgspec.structs.replace(cfg, postgres=postgres)


class Tenants(msgspec.Struct):
    ids: dict[str, list[str]]
    vectors: dict[str, np.ndarray]


@pytest.fixture(scope="module")
async def pool(postgres: EmbeddedPostgres) -> AsyncIterator[AsyncConnectionPool]:
    pool = await open_test_pool(postgres)
    yield pool
    await pool.close()


@pytest.fixture(scope="module")
async def tenants(pool: AsyncConnectionPool) -> Tenants:
    rng = np.random.default_rng(39)
    ids: dict[str, list[str]] = {}
    vectors: dict[str, np.ndarray] = {}
    store = PostgresStore(pool)
    for tenant, (session, rag) in SIZES.items():
        n = session + rag
        vectors[tenant] = unit_vectors(rng, n)
        ids[tenant] = [f"{tenant}-{i}" for i in range(n)]
        tiers = ["session"] * session + ["rag"] * rag
        await store.write_memories(
            tenant, [memory(ids[tenant][i], vectors[tenant][i], tier=tiers[i]) for i in range(n)]
        )
    await ensure_indexes(pool, placing(1000))
    async with pool.connection() as conn:
        await conn.execute("ANALYZE memories")
    return Tenants(ids=ids, vectors=vectors)


async def hnsw_indexes(pool: AsyncConnectionPool) -> dict[str, str]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'memories'"
            " AND indexdef LIKE '%%USING hnsw%%' ORDER BY indexname"
        )
        return {name: d for name, d in await cur.fetchall()}


async def flagged(pool: AsyncConnectionPool) -> dict[tuple[str, str], int]:
    """(tenant, tier) -> rows flagged ``own``."""
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT tenant, tier, count(*) FROM memories WHERE own GROUP BY tenant, tier")
        return {(tenant, tier): n for tenant, tier, n in await cur.fetchall()}


async def generic_plan(pool: AsyncConnectionPool, statement: str, params: dict[str, Any], ef_search: int) -> str:
    """``EXPLAIN EXECUTE`` of ``statement`` (psycopg's named placeholders)
    prepared, under a forced generic plan: the plan a search runs once its
    statement is prepared."""
    names: list[str] = []

    def number(m: re.Match[str]) -> str:
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"${names.index(m.group(1)) + 1}"

    text = re.sub(r"%\((\w+)\)s", number, statement).replace("%%", "%")
    async with pool.connection() as conn, conn.transaction():
        await set_search_params(conn, ef_search)
        await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        await conn.execute(f"PREPARE own_plan AS {text}")
        try:
            args = ", ".join(["%s"] * len(names))
            cur = psycopg.AsyncClientCursor(conn)
            await cur.execute(f"EXPLAIN (COSTS off) EXECUTE own_plan({args})", [params[n] for n in names])
            return "\n".join(row[0] for row in await cur.fetchall())
        finally:
            await conn.execute("DEALLOCATE own_plan")


async def placed(pool: AsyncConnectionPool, cfg: BraidConfig) -> dict[str, Any]:
    progress: dict[str, Any] = {}

    async def report(update: dict[str, Any]) -> None:
        for key, value in update.items():
            progress.setdefault(key, {}).update(value)

    await place_indexes(pool, cfg, report)
    return dict(progress["pgvector"])


async def test_large_tenants_get_an_index_of_their_own_and_their_searches_walk_it(
    pool: AsyncConnectionPool, tenants: Tenants
) -> None:
    cfg = placing(1000)
    shared = await hnsw_indexes(pool)
    q = {t: tenants.vectors[t][7] for t in SIZES}
    before = {t: await PgvectorSource(pool, lambda: cfg).search(query(t, q[t], limit=30)) for t in SIZES}

    progress = await placed(pool, cfg)
    # Only a tenant's tier holding 1000 memories or more: whale's session
    # tier (not its 600 rag), the odd name's session tier, never the minnow.
    assert progress["total"] == progress["done"] == 2
    assert progress["indexes"] == [
        {"tenant": "whale", "tier": "session", "memories": 1500},
        {"tenant": ODD, "tier": "session", "memories": 1200},
    ]
    assert await own_indexes(pool) == [
        (ODD, "session", own_index_name("session", ODD)),
        ("whale", "session", own_index_name("session", "whale")),
    ]
    indexes = await hnsw_indexes(pool)
    own = {name: d for name, d in indexes.items() if name not in shared}
    assert sorted(own) == sorted([own_index_name("session", "whale"), own_index_name("session", ODD)])
    assert "WHERE ((tier = 'session'::text) AND (tenant = 'whale'::text))" in own[own_index_name("session", "whale")]
    assert "(tenant = 'pike''s 100%'::text)" in own[own_index_name("session", ODD)]
    assert await index_params(pool, own_index_name("session", "whale")) == {"m": 16, "ef_construction": 64}
    # The shared index leaves out the rows flagged own: those of the tenant
    # tiers with an index of their own, and only those.
    assert shared["memories_hnsw_session"].endswith("WHERE ((tier = 'session'::text) AND (NOT own))")
    assert await flagged(pool) == {("whale", "session"): 1500, (ODD, "session"): 1200}
    # A second run has nothing to build.
    assert (await placed(pool, cfg))["total"] == 0

    log: list[dict[str, Any]] = []
    spy_pool = await recording_pool(pool.conninfo, log)
    try:
        source = PgvectorSource(spy_pool, lambda: cfg)
        after = {t: await source.search(query(t, q[t], limit=30)) for t in SIZES}
        async with pool.connection() as conn:
            for entry in log:
                async with conn.transaction():  # the plan under the search's own settings
                    await set_search_params(conn, int(entry["ef_search"]))
                    cur = await conn.execute("EXPLAIN (COSTS off) " + entry["statement"], entry["params"])
                    entry["plan"] = "\n".join(row[0] for row in await cur.fetchall())
    finally:
        await spy_pool.close()
    by_tier = {(e["params"]["tenant"], e["tier"]): e for e in log}
    # The tenant is named in the statement of its own tier, which the planner walks by its index.
    for tenant in ("whale", ODD):
        entry = by_tier[(tenant, "session")]
        assert "m.tenant = %(tenant)s" not in entry["statement"]
        assert f"Index Scan using {own_index_name('session', tenant)} " in entry["plan"]
    # Elsewhere the tenant stays a parameter and the shared index serves.
    assert "m.tenant = %(tenant)s" in by_tier[("whale", "rag")]["statement"]
    assert "Index Scan using memories_hnsw_rag " in by_tier[("whale", "rag")]["plan"]
    assert all("m.tenant = %(tenant)s" in e["statement"] for (t, _), e in by_tier.items() if t == "minnow")
    assert not any("memories_hnsw_own_" in e["plan"] for (t, _), e in by_tier.items() if t == "minnow")
    for tenant in SIZES:
        found = [h.id for h in after[tenant]]
        assert found[0] == f"{tenant}-7"
        assert all(h.id.startswith(f"{tenant}-") for h in after[tenant])
        top = exact_top(tenants.ids[tenant], tenants.vectors[tenant], q[tenant], 30)
        assert len(set(found) & set(top)) >= 27
        assert len(set(found) & {h.id for h in before[tenant]}) >= 27
    # The odd name's session rows came back through its own index.
    assert {h.tier for h in after[ODD]} == {"session"}

    # efSearchAt follows the size of the index a search walks: the tenant's own, or the shared one.
    sizes = PgvectorSource(pool, lambda: cfg)
    await sizes._read_own()
    await sizes._read_index_rows(cfg)
    assert sizes.tier_rows("session", cfg, "whale") == 1500
    assert sizes.tier_rows("session", cfg, ODD) == 1200
    assert sizes.tier_rows("session", cfg, "minnow") == sizes.tier_rows("session", cfg) == 3000  # as built

    # A source that has not read the own indexes yet walks the shared index,
    # which holds none of the flagged rows, and finds them exactly beside it.
    log.clear()
    spy_pool = await recording_pool(pool.conninfo, log)
    try:
        stale = PgvectorSource(spy_pool, lambda: cfg)
        stale._own_until = math.inf
        for tenant in ("whale", ODD):
            got = await stale.search(query(tenant, q[tenant], limit=30))
            assert [(h.id, round(h.score, 6)) for h in got] == [(h.id, round(h.score, 6)) for h in after[tenant]]
    finally:
        await spy_pool.close()
    assert all("m.tenant = %(tenant)s" in e["statement"] and "AND m.own ORDER BY" in e["statement"] for e in log)
    # Its generic plan (as searches run: plan_cache_mode) walks the shared
    # index and reads the flagged rows from their btree.
    whale = next(e for e in log if e["tier"] == "session" and e["params"]["tenant"] == "whale")
    plan = await generic_plan(pool, whale["statement"], whale["params"], int(whale["ef_search"]))
    assert "Index Scan using memories_hnsw_session " in plan, plan
    assert "Bitmap Index Scan on memories_own" in plan or "Index Scan using memories_own " in plan, plan


async def test_writes_flag_the_rows_of_a_tenant_tier_with_its_own_index(
    pool: AsyncConnectionPool, tenants: Tenants
) -> None:
    await placed(pool, placing(1000))
    rng = np.random.default_rng(7)
    store = PostgresStore(pool)
    new = {("whale", "session"): "whale-new-s", ("whale", "rag"): "whale-new-r", ("minnow", "session"): "minnow-new"}
    for (tenant, tier), mid in new.items():
        await store.write_memories(tenant, [memory(mid, unit_vectors(rng, 1)[0], tier=tier)])
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT id, own FROM memories WHERE id = ANY(%s)", (list(new.values()),))
        assert dict(await cur.fetchall()) == {"whale-new-s": True, "whale-new-r": False, "minnow-new": False}
        # A row moved to a tier without an index of the tenant's own loses its flag.
        await store.write_memories("whale", [memory("whale-new-s", unit_vectors(rng, 1)[0], tier="rag")])
        cur = await conn.execute("SELECT own FROM memories WHERE id = 'whale-new-s'")
        assert await cur.fetchone() == (False,)
        await conn.execute("DELETE FROM memories WHERE id = ANY(%s)", (list(new.values()),))
        # Flags gone wrong (a write that read the table as it changed) are set right by the next job.
        await conn.execute("UPDATE memories SET own = true WHERE tenant = 'minnow' AND id IN ('minnow-1', 'minnow-2')")
        await conn.execute("UPDATE memories SET own = false WHERE tenant = 'whale' AND id = 'whale-3'")
    assert (await flagged(pool))[("minnow", "session")] == 2
    await placed(pool, placing(1000))
    assert await flagged(pool) == {("whale", "session"): 1500, (ODD, "session"): 1200}


async def test_a_tier_reindex_rebuilds_own_indexes_and_a_shrunk_tenant_loses_its_own(
    pool: AsyncConnectionPool, tenants: Tenants
) -> None:
    await placed(pool, placing(1000))
    whale = own_index_name("session", "whale")
    async with pool.connection() as conn:  # lost meanwhile: the reindex builds it again
        await conn.execute(f"DROP INDEX {whale}")
    phases: list[dict[str, Any]] = []
    await rebuild_index(pool, placing(1000, m=24), "session", progress=phases.append)
    assert await index_params(pool, whale) == {"m": 24, "ef_construction": 64}
    assert await index_params(pool, own_index_name("session", ODD)) == {"m": 24, "ef_construction": 64}
    assert {p["index"] for p in phases if p["phase"] == "done"} >= {whale, own_index_name("session", ODD)}

    # An own index lost (dropped by hand, a restore without it) is built again by the next job.
    async with pool.connection() as conn:
        await conn.execute(f"DROP INDEX {own_index_name('session', ODD)}")
    rebuilt = await placed(pool, placing(1000))
    assert rebuilt["indexes"] == [{"tenant": ODD, "tier": "session", "memories": 1200}]
    assert own_index_name("session", ODD) in await hnsw_indexes(pool)

    # The whale falls to 400 session memories, under half the threshold: its index goes.
    gone = tenants.ids["whale"][400:1500]
    async with pool.connection() as conn:
        await conn.execute("DELETE FROM memories WHERE tenant = 'whale' AND id = ANY(%s)", (gone,))
    progress = await placed(pool, placing(1000))
    assert progress["dropped"] == [{"tenant": "whale", "tier": "session"}]
    assert [t for t, _, _ in await own_indexes(pool)] == [ODD]
    assert whale not in await hnsw_indexes(pool)
    # Its rows are back in the shared index.
    assert await flagged(pool) == {(ODD, "session"): 1200}
    # Its searches still answer, from the shared index.
    cfg = placing(1000)
    hits = await PgvectorSource(pool, lambda: cfg).search(
        query("whale", tenants.vectors["whale"][7], limit=10, filters=Filters(tiers=("session",)))
    )
    assert hits[0].id == "whale-7"

    # No threshold: nothing is built, nothing dropped.
    assert await placed(pool, placing(None)) == {
        "threshold": None,
        "indexes": [],
        "done": 0,
        "total": 0,
        "over_cap": [],
        "dropped": [],
    }
    assert [t for t, _, _ in await own_indexes(pool)] == [ODD]

    # Tiers compared exactly up to 700 rows: a tenant tier of 600 or fewer
    # walks no index, whatever the threshold, and gets none.
    exact = await placed(pool, placing(250, exact_below=700))
    assert (exact["indexes"], exact["over_cap"], exact["dropped"]) == ([], [], [])

    # A cap: the tiers of the most memories get the indexes. Past 250 now:
    # the odd name's session (1200, kept), the whale's rag (600) and session
    # (400), the minnow's two (300 each).
    capped = await placed(pool, placing(250, most=2))
    assert capped["indexes"] == [{"tenant": "whale", "tier": "rag", "memories": 600}]
    assert capped["over_cap"] == [
        {"tenant": "whale", "tier": "session", "memories": 400},
        {"tenant": "minnow", "tier": "rag", "memories": 300},
        {"tenant": "minnow", "tier": "session", "memories": 300},
    ]
    assert [(t, tier) for t, tier, _ in await own_indexes(pool)] == [(ODD, "session"), ("whale", "rag")]
    # A lower cap drops the smaller one.
    lowered = await placed(pool, placing(250, most=1))
    assert (lowered["total"], lowered["dropped"]) == (0, [{"tenant": "whale", "tier": "rag"}])
    assert [(t, tier) for t, tier, _ in await own_indexes(pool)] == [(ODD, "session")]
    assert own_index_name("rag", "whale") not in await hnsw_indexes(pool)


async def test_every_hnsw_build_runs_with_the_configured_build_memory_and_resets_it(
    postgres: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``postgres.indexBuildMemoryMb`` is the ``maintenance_work_mem`` of
    the start-up builds, a tier's reindex and a placement job's own index,
    read from the real server inside each build; the connection's setting
    is back to its default afterwards."""
    import indexers.own_index
    import indexers.pgvector
    from indexers.postgres.sql import build_memory

    seen: list[str] = []
    after: list[str] = []

    @asynccontextmanager
    async def spy(conn: Any, mb: int) -> AsyncIterator[None]:
        async with build_memory(conn, mb):
            cur = await conn.execute("SHOW maintenance_work_mem")
            seen.append((await cur.fetchone())[0])
            yield
        cur = await conn.execute("SHOW maintenance_work_mem")
        after.append((await cur.fetchone())[0])

    monkeypatch.setattr(indexers.pgvector, "build_memory", spy)
    monkeypatch.setattr(indexers.own_index, "build_memory", spy)
    cfg = placing(30, exact_below=10)
    cfg = msgspec.structs.replace(cfg, postgres=msgspec.structs.replace(cfg.postgres, index_build_memory_mb=96))
    pool = await open_test_pool(postgres)
    try:
        async with pool.connection() as conn:
            cur = await conn.execute("SHOW maintenance_work_mem")
            default = (await cur.fetchone())[0]  # type: ignore[index]
        assert default != "96MB"
        vectors = unit_vectors(np.random.default_rng(5), 40)
        await PostgresStore(pool).write_memories("whale", [memory(f"w-{i}", v) for i, v in enumerate(vectors)])
        created = await ensure_indexes(pool, cfg)
        await rebuild_index(pool, cfg, "session")
        progress = await placed(pool, cfg)
        assert progress["indexes"] == [{"tenant": "whale", "tier": "session", "memories": 40}]
        assert len(seen) == len(created) + 2 and set(seen) == {"96MB"}
        assert set(after) == {default}
    finally:
        await pool.close()
