"""The pgvector tiers against the real embedded Postgres 18 + pgvector 0.8.

One database per module holds a 20k-row corpus for the selective-filter
tests and small per-tenant sets for the rest; the index lifecycle tests
(ensure, rebuild) get a database of their own. Vectors are synthetic:
seeded, uniform on the unit sphere, L2-normalised. The dimension is small
(16): in 64-d uniform noise every point is about as far as every other and
an m=8 graph finds 2-3 of the true top 10, which says nothing about the code.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import msgspec
import numpy as np
import psycopg
import pytest
from pgvector.psycopg import register_vector_async
from psycopg_pool import AsyncConnectionPool

from config import BraidConfig, EfStep, TierConfig, load_config
from deploy.embedded import EmbeddedPostgres
from indexers.base import Filters, Hit, SearchQuery
from indexers.pgvector import (
    MAX_SCAN_TUPLES,
    PgvectorSource,
    ensure_indexes,
    index_name,
    index_params,
    rebuild_index,
    set_search_params,
)
from indexers.postgres import MemoryInput, PostgresStore, open_pool, tenant_transaction
from tests.api.conftest import fresh_database

pytestmark = pytest.mark.anyio

DIM = 16
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
BIG_TENANT = "big"
BIG_ROWS = 20_000
RARE_SHARE = 0.05


def make_config(**tier_changes: TierConfig) -> BraidConfig:
    # Random unit vectors are about orthogonal (cosine near 0): without its
    # floors the source returns its nearest ones, which these tests compare
    # with an exact search (the floors: tests/unit/test_source_floors.py).
    cfg = load_config().with_source("pgvector", min_similarity=None, relative_floor=0.0)
    tiers = {**cfg.tiers, **tier_changes}
    return msgspec.structs.replace(cfg, embedding=msgspec.structs.replace(cfg.embedding, dim=DIM), tiers=tiers)


def unit_vectors(rng: np.random.Generator, n: int) -> np.ndarray:
    v = rng.standard_normal((n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def memory(mid: str, vec: np.ndarray, **fields: Any) -> MemoryInput:
    values: dict[str, Any] = {"kind": "note", "tier": "session", "created_at": T0}
    values.update(fields)
    return MemoryInput(
        content=f"memory {mid}",
        embedding=tuple(float(x) for x in vec),
        model="synthetic",
        id=mid,
        **values,
    )


def query(tenant: str, vec: np.ndarray, limit: int = 10, **kw: Any) -> SearchQuery:
    kw.setdefault("model", "synthetic")
    return SearchQuery(tenant=tenant, text="", vector=tuple(float(x) for x in vec), limit=limit, **kw)


def exact_top(ids: Sequence[str], vectors: np.ndarray, q: np.ndarray, k: int) -> list[str]:
    distance = 1.0 - vectors @ q
    order = np.argsort(distance, kind="stable")[:k]
    return [ids[i] for i in order]


async def open_test_pool(postgres: EmbeddedPostgres) -> AsyncConnectionPool:
    return await open_pool(fresh_database(postgres), dim=DIM, min_size=1, max_size=4)


class Corpus(msgspec.Struct):
    ids: list[str]
    vectors: np.ndarray
    rare: np.ndarray  # bool mask: rows tagged `rare`


@pytest.fixture(scope="module")
async def pool(postgres: EmbeddedPostgres) -> AsyncIterator[AsyncConnectionPool]:
    pool = await open_test_pool(postgres)
    yield pool
    await pool.close()


@pytest.fixture(scope="module")
def cfg() -> BraidConfig:
    return make_config()


@pytest.fixture(scope="module")
async def corpus(pool: AsyncConnectionPool, cfg: BraidConfig) -> Corpus:
    """20k session memories of one tenant, 5% of them tagged `rare`, indexed."""
    rng = np.random.default_rng(20240501)
    vectors = unit_vectors(rng, BIG_ROWS)
    rare = rng.random(BIG_ROWS) < RARE_SHARE
    ids = [f"big-{i}" for i in range(BIG_ROWS)]
    await PostgresStore(pool).write_memories(
        BIG_TENANT,
        [
            memory(ids[i], vectors[i], tags=("rare",) if rare[i] else ("common",), created_at=T0 + timedelta(seconds=i))
            for i in range(BIG_ROWS)
        ],
    )
    await ensure_indexes(pool, cfg)
    async with pool.connection() as conn:
        await conn.execute("ANALYZE memories")
    return Corpus(ids=ids, vectors=vectors, rare=rare)


def recording_cursor(log: list[dict[str, Any]]) -> type[psycopg.AsyncCursor[Any]]:
    """A cursor that notes, for each tier search, the statement and the HNSW
    settings in force in its transaction (read from the real server)."""

    class RecordingCursor(psycopg.AsyncCursor[Any]):
        async def execute(self, query: Any, params: Any = None, **kw: Any) -> Any:
            if isinstance(query, str) and "FROM memories m" in query:
                cur = await self.connection.execute(
                    "SELECT current_setting('hnsw.ef_search'),"
                    " current_setting('hnsw.iterative_scan'),"
                    " current_setting('hnsw.max_scan_tuples')"
                )
                ef, mode, max_tuples = await cur.fetchone()  # type: ignore[misc]
                tier = re.search(r"m\.tier = '([^']+)'", query)
                log.append(
                    {
                        "tier": tier.group(1) if tier else None,
                        "ef_search": ef,
                        "iterative_scan": mode,
                        "max_scan_tuples": max_tuples,
                        "statement": query,
                        "params": params,
                    }
                )
            return await super().execute(query, params, **kw)

    return RecordingCursor


async def recording_pool(dsn: str, log: list[dict[str, Any]]) -> AsyncConnectionPool:
    pool = AsyncConnectionPool(
        dsn,
        min_size=1,
        max_size=1,
        open=False,
        configure=register_vector_async,
        kwargs={"autocommit": True, "cursor_factory": recording_cursor(log)},
    )
    await pool.open(wait=True, timeout=30)
    return pool


# --- index lifecycle ---------------------------------------------------------


async def test_ensure_indexes_creates_one_hnsw_index_per_tier_with_its_params(
    postgres: EmbeddedPostgres,
) -> None:
    # Three different settings, so a tier built with another's would show.
    cfg = make_config(
        session=TierConfig(holds="memories", m=8, ef_construction=32, ef_search=32),
        rag=TierConfig(holds="memories", m=16, ef_construction=64, ef_search=64),
    )
    pool = await open_test_pool(postgres)
    try:
        created = await ensure_indexes(pool, cfg)
        assert sorted(created) == ["entities_hnsw", "memories_hnsw_rag", "memories_hnsw_session"]
        assert await index_params(pool, "memories_hnsw_session") == {"m": 8, "ef_construction": 32}
        assert await index_params(pool, "memories_hnsw_rag") == {"m": 16, "ef_construction": 64}
        assert await index_params(pool, "entities_hnsw") == {"m": 24, "ef_construction": 128}

        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT indexname, tablename, indexdef FROM pg_indexes"
                " WHERE indexdef LIKE '%%USING hnsw%%' ORDER BY indexname"
            )
            defs = {name: (table, d) for name, table, d in await cur.fetchall()}
        assert set(defs) == set(created)
        table, session_def = defs["memories_hnsw_session"]
        assert table == "memories"
        assert "USING hnsw (embedding vector_cosine_ops) WITH (m='8', ef_construction='32')" in session_def
        # A tier's rows, less those of tenants with an index of their own there (indexers/own_index.py).
        assert session_def.endswith("WHERE ((tier = 'session'::text) AND (NOT own))")
        assert defs["memories_hnsw_rag"][1].endswith("WHERE ((tier = 'rag'::text) AND (NOT own))")
        table, entity_def = defs["entities_hnsw"]
        assert table == "entities"
        # The entities not flagged small (indexers/postgres/unshared.py).
        assert entity_def.endswith("WHERE (NOT small)")

        # Idempotent: nothing to create the second time, nothing changed.
        assert await ensure_indexes(pool, cfg) == []
        assert await index_params(pool, "memories_hnsw_session") == {"m": 8, "ef_construction": 32}
        with pytest.raises(LookupError, match="no index memories_hnsw_nope"):
            await index_params(pool, "memories_hnsw_nope")
    finally:
        await pool.close()


def test_index_names_follow_the_tier_and_refuse_unsafe_names() -> None:
    cfg = make_config()
    assert index_name("session", cfg) == "memories_hnsw_session"
    assert index_name("entities", cfg) == "entities_hnsw"
    assert index_name("long-term", cfg) == "memories_hnsw_long_term"
    # Cut below Postgres' 63-byte limit, kept apart by a digest of the tier.
    a, b = index_name("a" * 62 + "1", cfg), index_name("a" * 62 + "2", cfg)
    assert len(a) == len(b) == 62 and a != b and a.startswith("memories_hnsw_aaa")
    with pytest.raises(ValueError, match=r"invalid tier name \"x'; DROP TABLE memories; --\""):
        index_name("x'; DROP TABLE memories; --", cfg)


async def test_rebuild_index_applies_new_params_and_searches_keep_working(
    postgres: EmbeddedPostgres,
) -> None:
    cfg = make_config(
        session=TierConfig(holds="memories", m=8, ef_construction=32, ef_search=32),
        rag=TierConfig(holds="memories", m=16, ef_construction=64, ef_search=64),
    )
    pool = await open_test_pool(postgres)
    try:
        rng = np.random.default_rng(11)
        vectors = unit_vectors(rng, 3000)
        ids = [f"r-{i}" for i in range(len(vectors))]
        await PostgresStore(pool).write_memories("rb", [memory(i, v) for i, v in zip(ids, vectors)])
        await ensure_indexes(pool, cfg)
        assert await index_params(pool, "memories_hnsw_session") == {"m": 8, "ef_construction": 32}

        new_cfg = make_config(session=TierConfig(holds="memories", m=12, ef_construction=48, ef_search=32))
        source = PgvectorSource(pool, lambda: new_cfg)
        q = vectors[17]
        phases: list[object] = []
        during: list[list[Hit]] = []
        done = anyio.Event()

        async def rebuild() -> None:
            await rebuild_index(pool, new_cfg, "session", progress=lambda p: phases.append(p["phase"]))
            done.set()

        async def search_meanwhile() -> None:
            while not done.is_set():
                during.append(await source.search(query("rb", q)))
                await anyio.sleep(0.005)

        async with anyio.create_task_group() as tg:
            tg.start_soon(rebuild)
            tg.start_soon(search_meanwhile)

        assert phases == ["building", "done"]
        assert during, "no search ran while the index was rebuilt"
        assert all(len(hits) == 10 for hits in during)
        assert await index_params(pool, "memories_hnsw_session") == {"m": 12, "ef_construction": 48}
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT c.relname, i.indisvalid, pg_get_indexdef(i.indexrelid) FROM pg_index i"
                " JOIN pg_class c ON c.oid = i.indexrelid"
                " WHERE c.relname LIKE 'memories_hnsw_session%%'"
            )
            rows = await cur.fetchall()
        assert [(name, valid) for name, valid, _ in rows] == [("memories_hnsw_session", True)]
        assert rows[0][2].endswith("WHERE ((tier = 'session'::text) AND (NOT own))")
        # The other tiers were left alone.
        assert await index_params(pool, "memories_hnsw_rag") == {"m": 16, "ef_construction": 64}

        recall = []
        for q in vectors[:200:20]:
            after = await source.search(query("rb", q))
            assert len(after) == 10
            recall.append(len({h.id for h in after} & set(exact_top(ids, vectors, q, 10))))
        assert np.mean(recall) >= 9.0, recall
    finally:
        await pool.close()


async def test_tiers_with_the_longest_names_can_be_indexed_and_rebuilt(
    postgres: EmbeddedPostgres,
) -> None:
    # Tier names may be 63 characters; index names are cut at 63 bytes by
    # Postgres, so the rebuild's temporary name must not collide with the live one.
    long_tier = "t" * 63
    cfg = make_config(**{long_tier: TierConfig(holds="memories", m=8, ef_construction=32, ef_search=32)})
    pool = await open_test_pool(postgres)
    try:
        name = index_name(long_tier, cfg)
        assert len(name) <= 62
        assert name in await ensure_indexes(pool, cfg)
        rng = np.random.default_rng(2)
        vectors = unit_vectors(rng, 50)
        await PostgresStore(pool).write_memories(
            "lt", [memory(f"lt-{i}", v, tier=long_tier) for i, v in enumerate(vectors)]
        )
        new_cfg = make_config(**{long_tier: TierConfig(holds="memories", m=12, ef_construction=48)})
        await rebuild_index(pool, new_cfg, long_tier)
        assert await index_params(pool, name) == {"m": 12, "ef_construction": 48}
        hits = await PgvectorSource(pool, lambda: new_cfg).search(query("lt", vectors[3]))
        assert hits[0].id == "lt-3" and hits[0].tier == long_tier
    finally:
        await pool.close()


# --- search settings ---------------------------------------------------------


async def test_set_search_params_is_local_to_the_transaction(pool: AsyncConnectionPool) -> None:
    async with pool.connection() as conn:
        await conn.execute("SELECT '[1,0]'::vector <=> '[0,1]'::vector")  # loads pgvector's GUCs
        settings = (
            "SELECT current_setting('hnsw.ef_search'), current_setting('hnsw.iterative_scan'),"
            " current_setting('hnsw.max_scan_tuples'), current_setting('enable_sort'),"
            " current_setting('max_parallel_workers_per_gather')"
        )
        before = await (await conn.execute(settings)).fetchone()
        assert before == ("40", "off", "20000", "on", "2")
        async with conn.transaction():
            await set_search_params(conn, 123)
            inside = await (await conn.execute(settings)).fetchone()
        assert inside == ("123", "relaxed_order", str(MAX_SCAN_TUPLES), "off", "0")
        after = await (await conn.execute(settings)).fetchone()
        assert after == before


async def test_each_tier_search_runs_with_that_tiers_ef_search(pool: AsyncConnectionPool, corpus: Corpus) -> None:
    cfg = make_config(
        session=TierConfig(holds="memories", m=8, ef_construction=32, ef_search=37),
        rag=TierConfig(holds="memories", m=16, ef_construction=64, ef_search=91),
    )
    log: list[dict[str, Any]] = []
    spy_pool = await recording_pool(pool.conninfo, log)
    try:
        hits = await PgvectorSource(spy_pool, lambda: cfg).search(query(BIG_TENANT, corpus.vectors[0]))
        assert len(hits) == 10
        assert [(e["tier"], e["ef_search"], e["iterative_scan"], e["max_scan_tuples"]) for e in log] == [
            ("session", "37", "relaxed_order", str(MAX_SCAN_TUPLES)),
            ("rag", "91", "relaxed_order", str(MAX_SCAN_TUPLES)),
        ]
        # Nothing leaks onto the pooled connection once the search is over.
        async with spy_pool.connection() as conn:
            cur = await conn.execute("SELECT current_setting('hnsw.ef_search'), current_setting('hnsw.iterative_scan')")
            assert await cur.fetchone() == ("40", "off")
    finally:
        await spy_pool.close()


async def test_a_tier_with_ef_search_steps_searches_with_the_step_its_index_reached(
    pool: AsyncConnectionPool, corpus: Corpus
) -> None:
    cfg = make_config(
        session=TierConfig(
            holds="memories",
            m=8,
            ef_construction=32,
            ef_search=37,
            ef_search_at=(EfStep(rows=1000, ef_search=77), EfStep(rows=10**9, ef_search=500)),
        ),
        rag=TierConfig(
            holds="memories", m=16, ef_construction=64, ef_search=91, ef_search_at=(EfStep(rows=1, ef_search=300),)
        ),
    )
    log: list[dict[str, Any]] = []
    spy_pool = await recording_pool(pool.conninfo, log)
    try:
        source = PgvectorSource(spy_pool, lambda: cfg)
        hits = await source.search(query(BIG_TENANT, corpus.vectors[0]))
        assert len(hits) == 10
        # The session index holds the corpus (past 1,000 rows, far below 10^9);
        # the rag index holds no row, so its first step (1 row) is not reached.
        assert 1000 <= source.tier_rows("session", cfg) < 10**9
        assert source.tier_rows("rag", cfg) == 0
        assert [(e["tier"], e["ef_search"]) for e in log] == [("session", "77"), ("rag", "91")]
    finally:
        await spy_pool.close()


# --- selective filters: iterative index scan -----------------------------------


async def test_selective_filter_still_returns_top_k_from_the_hnsw_index(
    pool: AsyncConnectionPool, corpus: Corpus
) -> None:
    # The ~1000 rare rows are under the default exactBelow; 500 keeps this
    # search on the index, which is what the test is about.
    cfg = make_config(session=msgspec.structs.replace(make_config().tiers["session"], exact_below=500))
    rare_ids = [i for i, r in zip(corpus.ids, corpus.rare) if r]
    rare_vectors = corpus.vectors[corpus.rare]
    assert 900 < len(rare_ids) < 1100
    by_id = dict(zip(corpus.ids, corpus.vectors))
    log: list[dict[str, Any]] = []
    recall: list[int] = []
    spy_pool = await recording_pool(pool.conninfo, log)
    try:
        source = PgvectorSource(spy_pool, lambda: cfg)
        rng = np.random.default_rng(99)
        for q in unit_vectors(rng, 20):
            hits = await source.search(query(BIG_TENANT, q, filters=Filters(tags=("rare",), tiers=("session",))))
            assert len(hits) == 10
            assert {h.id for h in hits} <= set(rare_ids)
            assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
            for h in hits:
                assert h.score == pytest.approx(float(by_id[h.id] @ q), abs=1e-5)
                assert (h.tier, h.kind) == ("session", "note")
            recall.append(len({h.id for h in hits} & set(exact_top(rare_ids, rare_vectors, q, 10))))
    finally:
        await spy_pool.close()
    # Approximate, but close to the exact top 10 of the filtered rows. HNSW
    # levels are drawn at random, so runs differ a little (observed: means
    # 9.8-9.85, worst single query 8).
    assert np.mean(recall) >= 9.3 and min(recall) >= 7, recall

    # Each statement the source ran walks the session tier's HNSW index, and
    # only the iterative scan lets it return 10 rows: with it off, the same
    # index scan stops after ef_search (32) candidates, about 5% of them rare.
    assert [e["tier"] for e in log] == ["session"] * 20
    async with pool.connection() as conn:
        for search in log:
            statement, params = search["statement"], search["params"]
            for mode in ("relaxed_order", "off"):
                async with conn.transaction():
                    await set_search_params(conn, cfg.tiers["session"].ef_search)
                    await conn.execute("SELECT set_config('hnsw.iterative_scan', %s, true)", (mode,))
                    assert await executed_branch(conn, statement, params) == "hnsw"
                    rows = await (await conn.execute(statement, params)).fetchall()
                if mode == "off":
                    assert len(rows) < 10, rows
                else:
                    assert len(rows) == 10, rows


async def test_session_filter_is_selective_too(pool: AsyncConnectionPool, cfg: BraidConfig, corpus: Corpus) -> None:
    # 1% of another tenant's rows in one session. With fresh rows and no
    # ANALYZE the planner takes the (tenant, session_id) btree and sorts
    # exactly; the filter must come back full whichever plan is used.
    rng = np.random.default_rng(5)
    vectors = unit_vectors(rng, 4000)
    ids = [f"ses-{i}" for i in range(len(vectors))]
    sessions = ["s-hot" if i % 100 == 0 else f"s-{i % 37}" for i in range(len(vectors))]
    await PostgresStore(pool).write_memories(
        "sessions", [memory(i, v, session_id=s) for i, v, s in zip(ids, vectors, sessions)]
    )
    hot = [k for k, s in enumerate(sessions) if s == "s-hot"]
    source = PgvectorSource(pool, lambda: cfg)
    recall = []
    for q in unit_vectors(rng, 10):
        hits = await source.search(query("sessions", q, filters=Filters(session_id="s-hot")))
        assert len(hits) == 10
        assert {h.id for h in hits} <= {ids[k] for k in hot}
        exact = exact_top([ids[k] for k in hot], vectors[hot], q, 10)
        recall.append(len({h.id for h in hits} & set(exact)))
    assert np.mean(recall) >= 9.0, recall


# --- exact or HNSW: decided by a bounded count, not by the planner --------------


async def executed_branch(conn: psycopg.AsyncConnection, statement: str, params: Any) -> str:
    """Which of the statement's two branches ran: ``exact`` or ``hnsw``."""
    cur = await conn.execute("EXPLAIN (ANALYZE, COSTS off, BUFFERS off) " + statement, params)
    plan = [row[0] for row in await cur.fetchall()]
    hnsw = [line for line in plan if "Index Scan using memories_hnsw_" in line]
    assert len(hnsw) == 1, "\n".join(plan)
    return "exact" if "(never executed)" in hnsw[0] else "hnsw"


@pytest.mark.parametrize(("exact_below", "branch"), [(100_000, "exact"), (BIG_ROWS - 1, "hnsw"), (0, "hnsw")])
async def test_the_bounded_count_picks_the_branch(
    pool: AsyncConnectionPool, corpus: Corpus, exact_below: int, branch: str
) -> None:
    tier = msgspec.structs.replace(make_config().tiers["session"], exact_below=exact_below)
    cfg = make_config(session=tier)
    log: list[dict[str, Any]] = []
    spy_pool = await recording_pool(pool.conninfo, log)
    try:
        q = corpus.vectors[17]
        hits = await PgvectorSource(spy_pool, lambda: cfg).search(
            query(BIG_TENANT, q, filters=Filters(tiers=("session",)))
        )
    finally:
        await spy_pool.close()
    assert hits[0].id == "big-17"
    (search,) = log
    # As the source runs it: scoped to the tenant, under row-level security.
    async with tenant_transaction(pool, BIG_TENANT) as conn:
        await set_search_params(conn, tier.ef_search)
        assert await executed_branch(conn, search["statement"], search["params"]) == branch
    if branch == "exact":
        assert [h.id for h in hits] == exact_top(corpus.ids, corpus.vectors, q, 10)


async def test_a_small_match_set_is_searched_exactly_even_in_a_big_index(
    pool: AsyncConnectionPool, cfg: BraidConfig, corpus: Corpus
) -> None:
    # 300 rows of a small tenant beside the 20k of the big one, in one fresh
    # batch (no ANALYZE since): at most exactBelow rows match, so every
    # distance is compared and the top 10 is the exact one, every time.
    assert cfg.tiers["session"].exact_below >= 300
    rng = np.random.default_rng(11)
    vectors = unit_vectors(rng, 300)
    ids = [f"small-{i}" for i in range(300)]
    await PostgresStore(pool).write_memories("small", [memory(i, v) for i, v in zip(ids, vectors)])
    log: list[dict[str, Any]] = []
    spy_pool = await recording_pool(pool.conninfo, log)
    try:
        source = PgvectorSource(spy_pool, lambda: cfg)
        for q in unit_vectors(rng, 10):
            hits = await source.search(query("small", q))
            assert [h.id for h in hits] == exact_top(ids, vectors, q, 10)
    finally:
        await spy_pool.close()
    async with pool.connection() as conn:
        for search in log:
            async with conn.transaction():
                await set_search_params(conn, 64)
                assert await executed_branch(conn, search["statement"], search["params"]) == "exact"


async def test_a_tier_known_to_match_many_rows_is_walked_without_counting_for_a_while(
    pool: AsyncConnectionPool, cfg: BraidConfig, corpus: Corpus, monkeypatch: pytest.MonkeyPatch
) -> None:
    import indexers.pgvector as pgvector

    log: list[dict[str, Any]] = []
    spy_pool = await recording_pool(pool.conninfo, log)
    q = corpus.vectors[23]
    try:
        source = PgvectorSource(spy_pool, lambda: cfg)
        counted = await source.search(query(BIG_TENANT, q))
        walked = await source.search(query(BIG_TENANT, q))
        # Request filters: counted every time, whatever is remembered.
        filtered = await source.search(query(BIG_TENANT, q, filters=Filters(tags=("common", "rare"))))
        # Once the memory runs out: counted again, and remembered again.
        later = time.monotonic() + pgvector.WALK_MEMORY_S + 1
        monkeypatch.setattr(pgvector, "monotonic", lambda: later)
        recounted = await source.search(query(BIG_TENANT, q))
        await source.search(query(BIG_TENANT, q))
    finally:
        await spy_pool.close()
    assert [h.id for h in walked] == [h.id for h in counted] == [h.id for h in filtered]
    assert counted[0].id == "big-23"
    session = [e["statement"] for e in log if e["tier"] == "session"]
    assert ["count(*)" in s for s in session] == [True, False, True, True, False]
    # What the walk skips is what the count would have chosen anyway.
    async with tenant_transaction(pool, BIG_TENANT) as conn:
        await set_search_params(conn, cfg.tiers["session"].ef_search)
        assert await executed_branch(conn, session[0], log[0]["params"]) == "hnsw"
    assert recounted[0].id == "big-23"


async def test_tiers_known_to_walk_are_walked_in_one_merged_statement(
    pool: AsyncConnectionPool, corpus: Corpus
) -> None:
    # Two tiers of 600 rows each, past exactBelow (200): both walk their index.
    rng = np.random.default_rng(44)
    vectors = unit_vectors(rng, 1200)
    ids = [f"two-{i}" for i in range(1200)]
    tiers = ["session" if i % 2 else "rag" for i in range(1200)]
    await PostgresStore(pool).write_memories(
        "two-tiers", [memory(ids[i], vectors[i], tier=tiers[i]) for i in range(1200)]
    )
    cfg = make_config(
        session=TierConfig(holds="memories", m=16, ef_construction=64, ef_search=37, exact_below=200),
        rag=TierConfig(holds="memories", m=16, ef_construction=64, ef_search=91, exact_below=200),
    )
    log: list[dict[str, Any]] = []
    spy_pool = await recording_pool(pool.conninfo, log)
    try:
        source = PgvectorSource(spy_pool, lambda: cfg)
        found = {}
        for i in (5, 6):  # a session row, then a rag row
            first = await source.search(query("two-tiers", vectors[i], limit=30))
            again = await source.search(query("two-tiers", vectors[i], limit=30))
            filtered = await source.search(query("two-tiers", vectors[i], limit=30, filters=Filters(tags=("x",))))
            found[i] = (first, again, filtered)
    finally:
        await spy_pool.close()

    def both(statement: str) -> bool:
        return "m.tier = 'session'" in statement and "m.tier = 'rag'" in statement

    searches = [(e["ef_search"], e["statement"]) for e in log]
    # The first search counts each tier (its own settings); the next walks
    # both tiers in one statement under the larger efSearch; a search with
    # request filters counts again.
    assert [(ef, "count(*)" in s, both(s)) for ef, s in searches[:3]] == [
        ("37", True, False),
        ("91", True, False),
        ("91", False, True),
    ]
    assert [("count(*)" in s, both(s)) for _, s in searches[3:5]] == [(True, False), (True, False)]
    # The second query finds its tiers remembered as walking: merged at once.
    assert [both(s) for _, s in searches[5:]] == [True, True, False, False]
    # Row 5's first search was counted, its second merged; row 6's were both merged.
    for i, (first, merged, filtered) in found.items():
        assert filtered == []  # no row is tagged
        assert merged[0].id == ids[i]
        assert [h.id for h in merged] == [h.id for h in first]
        assert [h.score for h in merged] == pytest.approx([h.score for h in first])
        # Rows of both tiers, in one list by distance.
        assert {h.tier for h in merged} == {"session", "rag"}
        assert [h.score for h in merged] == sorted((h.score for h in merged), reverse=True)
        assert len(set(h.id for h in merged) & set(exact_top(ids, vectors, vectors[i], 30))) >= 27


# --- tenants and filters -----------------------------------------------------


async def test_search_never_crosses_tenants(pool: AsyncConnectionPool, cfg: BraidConfig, corpus: Corpus) -> None:
    rng = np.random.default_rng(3)
    vectors = unit_vectors(rng, 40)
    store = PostgresStore(pool)
    await store.write_memories("tenant-a", [memory(f"a-{i}", v) for i, v in enumerate(vectors)])
    await store.write_memories("tenant-b", [memory(f"b-{i}", v) for i, v in enumerate(vectors)])
    source = PgvectorSource(pool, lambda: cfg)
    for i in (0, 7, 39):
        a = await source.search(query("tenant-a", vectors[i], limit=40))
        b = await source.search(query("tenant-b", vectors[i], limit=40))
        assert len(a) == len(b) == 40
        assert a[0].id == f"a-{i}" and b[0].id == f"b-{i}"
        assert all(h.id.startswith("a-") for h in a)
        assert all(h.id.startswith("b-") for h in b)
    assert await source.search(query("tenant-c", vectors[0])) == []


FILTER_ROWS = {
    "f-base",
    "f-kind",
    "f-rag",
    "f-old",
    "f-new",
    "f-lowconf",
    "f-s2",
    "f-nosession",
    "f-tagged",
}

#: name -> (SearchQuery fields, the ids it returns)
FILTER_CASES: dict[str, tuple[dict[str, Any], set[str]]] = {
    "none": ({}, FILTER_ROWS),
    "kinds": ({"filters": Filters(kinds=("note",))}, FILTER_ROWS - {"f-kind"}),
    "tiers-session": ({"filters": Filters(tiers=("session",))}, FILTER_ROWS - {"f-rag"}),
    "tiers-rag": ({"filters": Filters(tiers=("rag",))}, {"f-rag"}),
    "tiers-entities": ({"filters": Filters(tiers=("entities",))}, set()),
    "created-after": ({"filters": Filters(created_after=T0)}, FILTER_ROWS - {"f-old"}),
    "created-before": ({"filters": Filters(created_before=T0 + timedelta(days=5))}, FILTER_ROWS - {"f-new"}),
    "min-confidence": ({"min_confidence": 0.5}, FILTER_ROWS - {"f-lowconf"}),
    "session": ({"filters": Filters(session_id="s1")}, FILTER_ROWS - {"f-s2", "f-nosession"}),
    "tags": ({"filters": Filters(tags=("x", "y"))}, {"f-tagged"}),
    "combined": (
        {"filters": Filters(kinds=("note",), tiers=("session",), session_id="s1"), "min_confidence": 0.5},
        {"f-base", "f-old", "f-new", "f-tagged"},
    ),
}


@pytest.fixture(scope="module")
async def filter_rows(pool: AsyncConnectionPool, corpus: Corpus) -> dict[str, np.ndarray]:
    """Rows near one another, each differing from `f-base` in one field."""
    rng = np.random.default_rng(8)
    center = unit_vectors(rng, 1)[0]
    noise = rng.standard_normal((9, DIM)).astype(np.float32) * 0.05
    vecs = (center + noise) / np.linalg.norm(center + noise, axis=1, keepdims=True)
    base: dict[str, Any] = {"session_id": "s1", "confidence": 0.9, "created_at": T0 + timedelta(days=1)}
    rows = {
        "f-base": {},
        "f-kind": {"kind": "preference"},
        "f-rag": {"tier": "rag"},
        "f-old": {"created_at": T0 - timedelta(days=10)},
        "f-new": {"created_at": T0 + timedelta(days=10)},
        "f-lowconf": {"confidence": 0.2},
        "f-s2": {"session_id": "s2"},
        "f-nosession": {"session_id": None},
        "f-tagged": {"tags": ("y", "z")},
    }
    await PostgresStore(pool).write_memories(
        "filters",
        [memory(mid, vecs[k], **{**base, **over}) for k, (mid, over) in enumerate(rows.items())],
    )
    return {"center": center}


@pytest.mark.parametrize("case", list(FILTER_CASES))
async def test_each_filter_excludes_what_it_should(
    pool: AsyncConnectionPool, cfg: BraidConfig, filter_rows: dict[str, np.ndarray], case: str
) -> None:
    fields, expected = FILTER_CASES[case]
    hits = await PgvectorSource(pool, lambda: cfg).search(query("filters", filter_rows["center"], limit=50, **fields))
    assert {h.id for h in hits} == expected
    assert len(hits) == len(expected)


async def test_no_vector_means_no_hits(pool: AsyncConnectionPool, cfg: BraidConfig) -> None:
    q = SearchQuery(tenant=BIG_TENANT, text="anything", vector=None, limit=10)
    assert await PgvectorSource(pool, lambda: cfg).search(q) == []


async def test_no_parallel_workers_are_launched_for_the_exact_branch(pool: AsyncConnectionPool, corpus: Corpus) -> None:
    # A big tenant (here: parallelism made cheap, as a table of 100k 384-d
    # rows makes it): the planner makes the exact branch a parallel scan
    # unless told not to, and Gather starts its workers before the branch's
    # one-time filter (false here) is ever checked.
    cfg = make_config()
    log: list[dict[str, Any]] = []
    spy_pool = await recording_pool(pool.conninfo, log)
    try:
        await PgvectorSource(spy_pool, lambda: cfg).search(
            query(BIG_TENANT, corpus.vectors[3], filters=Filters(tiers=("session",)))
        )
    finally:
        await spy_pool.close()
    (search,) = log
    async with tenant_transaction(pool, BIG_TENANT) as conn:
        await conn.execute(
            "SELECT set_config('min_parallel_table_scan_size', '0', true),"
            " set_config('parallel_setup_cost', '0', true), set_config('parallel_tuple_cost', '0', true)"
        )
        await set_search_params(conn, 48)
        cur = await conn.execute("EXPLAIN (ANALYZE, COSTS off, BUFFERS off) " + search["statement"], search["params"])
        plan = "\n".join(row[0] for row in await cur.fetchall())
    assert "Workers Launched" not in plan and "Index Scan using memories_hnsw_session" in plan, plan
