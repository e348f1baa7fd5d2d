"""Large tenants' own HNSW indexes (``indexers/own_index.py``) against the
real embedded Postgres 18 + pgvector 0.8: built by the placement step, walked
by the pgvector source, rebuilt by a tier reindex, dropped when the tenant
shrinks. Vectors as in ``test_pgvector.py``: seeded, 16-d, unit length."""

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
