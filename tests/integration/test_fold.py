"""The decay fold (``tiers.<t>.objective: decayed``) against the real embedded
Postgres 18 + pgvector 0.8: the folded column filled at write time, one
inner-product HNSW index per epoch, the pgvector source ranking by
``cosine x w(importance) x exp(-lambda * age)`` in both of its branches, and
re-centring through the reindex of the tier.

The oracle is numpy's float64 computation of that objective over every row
the search may return. Each test that changes the fold's state gets a database
of its own (the fold is per tier, across tenants). Vectors are synthetic:
seeded, uniform on the 16-d unit sphere (see test_pgvector.py for why 16).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import msgspec
import numpy as np
import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from config import BraidConfig, ConfigHolder, TierConfig
from deploy.embedded import EmbeddedPostgres
from indexers.base import Filters, Hit
from indexers.engine import Engine
from indexers.pgvector import PgvectorSource, ensure_indexes, index_name, rebuild_index, set_search_params
from indexers.postgres import PostgresStore, tenant_transaction
from indexers.postgres.fold import (
    RECENTRE_EXPONENT,
    Epoch,
    decay_rate,
    fold_index_ddl,
    fold_index_name,
    importance_weights,
    move_rows,
    objective,
    open_epoch,
    read_epochs,
)
from indexers.reindex import ReindexJobs
from tests.integration.test_pgvector import make_config, memory, open_test_pool, query, recording_pool, unit_vectors

pytestmark = pytest.mark.anyio

HALF_LIFE = 30.0
DAY = 86_400.0
#: The recalls' reference time: about now (the fold's anchor is the server's clock).
NOW = datetime.now(UTC).replace(microsecond=0)


def decayed(**changes: Any) -> TierConfig:
    values: dict[str, Any] = {
        "holds": "memories",
        "m": 16,
        "ef_construction": 64,
        "ef_search": 48,
        "objective": "decayed",
        "half_life_days": HALF_LIFE,
    }
    values.update(changes)
    return TierConfig(**values)


def decayed_config(**changes: Any) -> BraidConfig:
    return make_config(session=decayed(**changes))


class Rows(msgspec.Struct):
    """Memories written to one tenant, as the oracle needs them."""

    ids: list[str]
    vectors: np.ndarray
    importance: list[float | None]
    created_at: list[datetime]

    def top(self, q: np.ndarray, k: int, reference: datetime = NOW, half_life: float = HALF_LIFE) -> list[str]:
        return [self.ids[i] for i in self.order(q, reference, half_life)[:k]]

    def scores(self, q: np.ndarray, reference: datetime = NOW, half_life: float = HALF_LIFE) -> np.ndarray:
        age = np.array([(reference - t).total_seconds() for t in self.created_at])
        return objective(
            self.vectors.astype(np.float64) @ q, importance_weights(self.importance), age, decay_rate(half_life)
        )

    def norms(self, reference: datetime = NOW, half_life: float = HALF_LIFE) -> np.ndarray:
        """``w x exp(-λ age)``: the scale of each row's float4 rounding error."""
        age = np.array([(reference - t).total_seconds() for t in self.created_at])
        return objective(np.ones(len(self.ids)), importance_weights(self.importance), age, decay_rate(half_life))

    def order(self, q: np.ndarray, reference: datetime = NOW, half_life: float = HALF_LIFE) -> np.ndarray:
        s = self.scores(q, reference, half_life)
        # Best first, ties by id (as the source breaks them).
        return np.array(sorted(range(len(s)), key=lambda i: (-s[i], self.ids[i])))


async def write_rows(
    pool: AsyncConnectionPool, tenant: str, n: int, seed: int, *, days: float = 120.0, tier: str = "session"
) -> Rows:
    """``n`` memories with ages spread over ``days`` before NOW and random
    importance (a fifth without one)."""
    rng = np.random.default_rng(seed)
    vectors = unit_vectors(rng, n)
    importance: list[float | None] = [None if rng.random() < 0.2 else round(float(rng.random()), 3) for _ in range(n)]
    created = [NOW - timedelta(seconds=float(s)) for s in rng.uniform(0, days * DAY, n)]
    ids = [f"{tenant}-{i}" for i in range(n)]
    await PostgresStore(pool).write_memories(
        tenant,
        [
            memory(ids[i], vectors[i], tier=tier, importance=importance[i], created_at=created[i], confidence=0.9)
            for i in range(n)
        ],
    )
    return Rows(ids=ids, vectors=vectors, importance=importance, created_at=created)


def assert_scores(hits: Sequence[Hit], rows: Rows, q: np.ndarray, reference: datetime = NOW) -> None:
    """Each hit's score is its objective at ``reference``, to float4's precision."""
    index = {mid: i for i, mid in enumerate(rows.ids)}
    truth, norms = rows.scores(q, reference), rows.norms(reference)
    for h in hits:
        i = index[h.id]
        assert abs(h.score - truth[i]) <= 2e-6 * norms[i] + 1e-300, (h.id, h.score, truth[i])


async def explain_branch(pool: AsyncConnectionPool, tenant: str, search: dict[str, Any], ef_search: int) -> str:
    """Which branch of a logged tier statement runs: ``exact`` or ``hnsw`` (of a fold index)."""
    async with tenant_transaction(pool, tenant) as conn:
        await set_search_params(conn, ef_search)
        cur = await conn.execute("EXPLAIN (ANALYZE, COSTS off, BUFFERS off) " + search["statement"], search["params"])
        plan = [row[0] for row in await cur.fetchall()]
    scans = [line for line in plan if "Index Scan using memories_fold_" in line]
    assert len(scans) == 1, "\n".join(plan)
    return "exact" if "(never executed)" in scans[0] else "hnsw"


async def fold_state(pool: AsyncConnectionPool, tier: str = "session") -> list[Epoch]:
    async with pool.connection() as conn:
        return (await read_epochs(conn)).get(tier, [])


async def index_defs(pool: AsyncConnectionPool) -> dict[str, str]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE indexdef LIKE '%%USING hnsw%%' ORDER BY indexname"
        )
        return dict(await cur.fetchall())  # type: ignore[arg-type]


@pytest.fixture
async def pool(postgres: EmbeddedPostgres) -> AsyncIterator[AsyncConnectionPool]:
    pool = await open_test_pool(postgres)
    yield pool
    await pool.close()


# --- the fold is created with the tier -----------------------------------------


async def test_a_new_decayed_tier_gets_its_fold_and_an_inner_product_index(pool: AsyncConnectionPool) -> None:
    cfg = decayed_config(m=12, ef_construction=48)
    before = datetime.now(UTC)
    created = await ensure_indexes(pool, cfg)
    (epoch,) = await fold_state(pool)
    assert (epoch.half_life_days, epoch.filling) == (HALF_LIFE, False)
    assert before - timedelta(seconds=1) <= epoch.anchor <= datetime.now(UTC)
    name = fold_index_name("session", epoch.epoch)
    # No cosine index for the decayed tier; the others are as before.
    assert sorted(created) == sorted([name, "memories_hnsw_rag", "entities_hnsw"])
    defs = await index_defs(pool)
    assert "USING hnsw (folded vector_ip_ops) WITH (m='12', ef_construction='48')" in defs[name]
    assert defs[name].endswith(f"WHERE ((tier = 'session'::text) AND (fold_epoch = {epoch.epoch}))")
    # Idempotent, and a second process starting at once finds the same fold.
    assert await ensure_indexes(pool, cfg) == []
    assert await fold_state(pool) == [epoch]


async def test_a_write_folds_with_the_tiers_epoch_and_only_there(pool: AsyncConnectionPool) -> None:
    await ensure_indexes(pool, decayed_config())
    (epoch,) = await fold_state(pool)
    rng = np.random.default_rng(4)
    v = unit_vectors(rng, 2)
    t = epoch.anchor - timedelta(days=HALF_LIFE)
    await PostgresStore(pool).write_memories(
        "w", [memory("w-s", v[0], importance=0.8, created_at=t), memory("w-r", v[1], tier="rag", created_at=t)]
    )
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT id, folded, fold_epoch FROM memories WHERE tenant = 'w' ORDER BY id")
        (rag_id, rag_folded, rag_epoch), (s_id, s_folded, s_epoch) = await cur.fetchall()
    assert (rag_id, rag_folded, rag_epoch) == ("w-r", None, None)
    assert (s_id, s_epoch) == ("w-s", epoch.epoch)
    # embedding x importance x exp(λ(t - anchor)), one half-life before the anchor.
    np.testing.assert_allclose(s_folded.to_numpy(), v[0] * 0.8 * 0.5, rtol=1e-6)


# --- ranking: exact branch and HNSW branch ------------------------------------------


def folded_searches(log: list[dict[str, Any]], searches: int) -> list[dict[str, Any]]:
    """The session tier's statements of ``searches`` searches by one source,
    each by the folded index. A source's first search runs the cosine
    statement it guessed (it has not read the tier's fold yet), reads the
    fold, and searches again: that first guess is left out."""
    session = [e for e in log if e["tier"] == "session"]
    if len(session) == searches + 1:
        assert "m.embedding <=> %(vec)s" in session[0]["statement"]
        session = session[1:]
    assert len(session) == searches and all("m.folded <#> %(vec)s" in e["statement"] for e in session)
    return session


async def test_the_exact_branch_ranks_by_the_decayed_objective(pool: AsyncConnectionPool) -> None:
    cfg = decayed_config()
    await ensure_indexes(pool, cfg)
    rows = await write_rows(pool, "small", 300, seed=1)
    log: list[dict[str, Any]] = []
    spy = await recording_pool(pool.conninfo, log)
    try:
        source = PgvectorSource(spy, lambda: cfg)
        for q in unit_vectors(np.random.default_rng(2), 10):
            hits = await source.search(query("small", q, reference_time=NOW))
            assert [h.id for h in hits] == rows.top(q, 10)
            assert_scores(hits, rows, q)
            # The shown fields are the memory's own: confidence as stored.
            assert [h.confidence for h in hits] == [pytest.approx(0.9)] * 10
    finally:
        await spy.close()
    session = folded_searches(log, 10)
    assert await explain_branch(pool, "small", session[0], 48) == "exact"


async def test_the_hnsw_branch_finds_the_exact_top_10_where_its_recall_is_1(pool: AsyncConnectionPool) -> None:
    # exactBelow 0: always the index. 4000 rows, efSearch 400: HNSW recall is 1 here.
    cfg = decayed_config(ef_construction=200, ef_search=400, exact_below=0)
    await ensure_indexes(pool, cfg)
    rows = await write_rows(pool, "big", 4000, seed=3)
    async with pool.connection() as conn:
        await conn.execute("ANALYZE memories")
    log: list[dict[str, Any]] = []
    spy = await recording_pool(pool.conninfo, log)
    try:
        source = PgvectorSource(spy, lambda: cfg)
        for q in unit_vectors(np.random.default_rng(5), 20):
            hits = await source.search(query("big", q, reference_time=NOW))
            assert [h.id for h in hits] == rows.top(q, 10)
            assert_scores(hits, rows, q)
    finally:
        await spy.close()
    session = folded_searches(log, 20)
    assert await explain_branch(pool, "big", session[0], 400) == "hnsw"


async def test_the_reference_time_moves_the_ranking(pool: AsyncConnectionPool) -> None:
    cfg = decayed_config()
    await ensure_indexes(pool, cfg)
    rows = await write_rows(pool, "ref", 200, seed=6, days=400.0)
    source = PgvectorSource(pool, lambda: cfg)
    q = unit_vectors(np.random.default_rng(7), 1)[0]
    for reference in (NOW, NOW + timedelta(days=90), NOW - timedelta(days=200)):
        hits = await source.search(query("ref", q, limit=20, reference_time=reference))
        assert [h.id for h in hits] == rows.top(q, 20, reference)
        assert_scores(hits, rows, q, reference)
    # Without one, the server's clock.
    hits = await source.search(query("ref", q, limit=20))
    assert [h.id for h in hits] == rows.top(q, 20, datetime.now(UTC))


async def test_importance_and_recency_break_equal_similarity(pool: AsyncConnectionPool) -> None:
    cfg = decayed_config()
    await ensure_indexes(pool, cfg)
    v = unit_vectors(np.random.default_rng(8), 1)[0]
    other = unit_vectors(np.random.default_rng(9), 1)[0]
    t = NOW - timedelta(days=10)
    await PostgresStore(pool).write_memories(
        "ties",
        [
            memory("low", v, importance=0.3, created_at=t),
            memory("high", v, importance=0.9, created_at=t),
            memory("none", v, importance=None, created_at=t),
            memory("low-newer", v, importance=0.3, created_at=t + timedelta(days=5)),
            memory("low-older", v, importance=0.3, created_at=t - timedelta(days=5)),
            memory("unrelated", other, importance=1.0, created_at=NOW),
        ],
    )
    hits = await PgvectorSource(pool, lambda: cfg).search(query("ties", v, limit=5, reference_time=NOW))
    # No importance weighs 0.5: between 0.3 and 0.9.
    assert [h.id for h in hits] == ["high", "none", "low-newer", "low", "low-older"]
    decay = 2 ** (-10 / HALF_LIFE)
    assert [h.score for h in hits[:2]] == [pytest.approx(0.9 * decay, rel=1e-6), pytest.approx(0.5 * decay, rel=1e-6)]


async def test_similarity_tiers_rank_as_before_beside_a_decayed_one(pool: AsyncConnectionPool) -> None:
    cfg = decayed_config()
    await ensure_indexes(pool, cfg)
    await write_rows(pool, "mix", 100, seed=10)
    rag = await write_rows(pool, "mix-rag", 100, seed=11, tier="rag")
    source = PgvectorSource(pool, lambda: cfg)
    for q in unit_vectors(np.random.default_rng(12), 5):
        hits = await source.search(query("mix-rag", q, filters=Filters(tiers=("rag",)), reference_time=NOW))
        cosine = rag.vectors.astype(np.float64) @ q
        assert [h.id for h in hits] == [rag.ids[i] for i in np.argsort(-cosine, kind="stable")[:10]]
        for h in hits:
            assert h.score == pytest.approx(cosine[rag.ids.index(h.id)], abs=1e-5)
    # Tenants stay apart in the decayed tier too.
    assert await source.search(query("nobody", rag.vectors[0], reference_time=NOW)) == []
    hits = await source.search(query("mix", rag.vectors[0], limit=100, reference_time=NOW))
    assert len(hits) == 100 and all(h.id.startswith("mix-") and h.tier == "session" for h in hits)


# --- re-centring, new half-life, objective changes: through the reindex ---------


async def test_recentring_moves_the_anchor_and_keeps_the_order(pool: AsyncConnectionPool) -> None:
    # A fold anchored 40 half-lives ago: today's memories fold with e^27.7,
    # past RECENTRE_EXPONENT, so a reindex of the tier re-centres it.
    # (efSearch 400: the index's answers are exact at these sizes.)
    cfg = decayed_config(ef_construction=200, ef_search=400)
    old_anchor = NOW - timedelta(days=40 * HALF_LIFE)
    async with pool.connection() as conn:
        old = await open_epoch(conn, "session", HALF_LIFE, filling=False, anchor=old_anchor)
    assert old.exponent(NOW) == pytest.approx(40 * math.log(2)) and old.exponent(NOW) > RECENTRE_EXPONENT
    await ensure_indexes(pool, cfg)
    rows = await write_rows(pool, "rc", 600, seed=13)
    big = await write_rows(pool, "rc-big", 2500, seed=14)  # over exactBelow: its searches walk the index
    source = PgvectorSource(pool, lambda: cfg)
    queries = unit_vectors(np.random.default_rng(15), 10)
    before = [await source.search(query("rc", q, reference_time=NOW)) for q in queries]
    before_big = [await source.search(query("rc-big", q, reference_time=NOW)) for q in queries]

    async def max_norm() -> float:
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT max(vector_norm(folded)) FROM memories WHERE tier = 'session'")
            row = await cur.fetchone()
            return float(row[0]) if row else math.nan

    assert 1e11 < await max_norm() < math.exp(40 * math.log(2))

    phases: list[dict[str, object]] = []
    await rebuild_index(pool, cfg, "session", progress=phases.append)

    (new,) = await fold_state(pool)
    assert new.epoch > old.epoch and not new.filling and new.half_life_days == HALF_LIFE
    assert abs((new.anchor - datetime.now(UTC)).total_seconds()) < 120
    assert [p["phase"] for p in phases][0] == "building" and phases[-1]["phase"] == "done"
    assert phases[-1]["moved"] == 3100 and phases[-1]["retired"] == [old.epoch]
    defs = await index_defs(pool)
    assert fold_index_name("session", new.epoch) in defs and fold_index_name("session", old.epoch) not in defs
    assert "memories_hnsw_session" not in defs
    # Finite and back near 1 (the newest memories' exponent is about 0 again).
    assert 0.5 < await max_norm() <= 1.0 + 1e-6
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM memories WHERE tier = 'session' AND fold_epoch <> %s", (new.epoch,)
        )
        assert await cur.fetchone() == (0,)
    after = [await source.search(query("rc", q, reference_time=NOW)) for q in queries]
    after_big = [await source.search(query("rc-big", q, reference_time=NOW)) for q in queries]
    for q, b, a, bb, ab in zip(queries, before, after, before_big, after_big):
        assert [h.id for h in a] == [h.id for h in b] == rows.top(q, 10)
        assert [h.id for h in ab] == [h.id for h in bb] == big.top(q, 10)
        assert_scores(a, rows, q)
        assert_scores(ab, big, q)
        assert [h.score for h in a] == pytest.approx([h.score for h in b], rel=1e-5)


async def test_searches_during_a_refold_see_every_memory_once(pool: AsyncConnectionPool) -> None:
    cfg = decayed_config()
    await ensure_indexes(pool, cfg)
    rows = await write_rows(pool, "mv", 1500, seed=16)
    (old,) = await fold_state(pool)
    async with pool.connection() as conn:
        new = await open_epoch(conn, "session", HALF_LIFE, filling=True)
        await conn.execute(
            fold_index_ddl(
                "session", new.epoch, cfg.tiers["session"], fold_index_name("session", new.epoch), concurrently=True
            )
        )
    # A write after the epoch opened folds with it.
    v = unit_vectors(np.random.default_rng(17), 1)[0]
    await PostgresStore(pool).write_memories("mv", [memory("mv-late", v, created_at=NOW)])
    source = PgvectorSource(pool, lambda: cfg)
    queries = unit_vectors(np.random.default_rng(18), 8)
    late = Rows(
        ids=[*rows.ids, "mv-late"],
        vectors=np.vstack([rows.vectors, v]),
        importance=[*rows.importance, None],
        created_at=[*rows.created_at, NOW],
    )
    mixed = 0
    done = anyio.Event()

    async def mover() -> None:
        async with pool.connection() as conn:
            await move_rows(conn, new, batch=40)
        done.set()

    async def searcher() -> None:
        nonlocal mixed
        i = 0
        while not done.is_set():
            q = queries[i % len(queries)]
            i += 1
            live = await fold_state(pool)
            hits = await source.search(query("mv", q, reference_time=NOW))
            assert [h.id for h in hits] == late.top(q, 10)
            assert_scores(hits, late, q)
            mixed += len(live) == 2

    async with anyio.create_task_group() as tg:
        tg.start_soon(mover)
        tg.start_soon(searcher)
    assert mixed >= 3, mixed
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT fold_epoch, count(*) FROM memories WHERE tenant = 'mv' GROUP BY 1")
        assert await cur.fetchall() == [(new.epoch, 1501)]
    assert [e.epoch for e in await fold_state(pool)] == [old.epoch, new.epoch]


async def test_objective_changes_apply_through_a_reindex(pool: AsyncConnectionPool) -> None:
    similarity = make_config()
    await ensure_indexes(pool, similarity)
    rows = await write_rows(pool, "sw", 500, seed=19)
    q = unit_vectors(np.random.default_rng(20), 1)[0]
    cosine = rows.vectors.astype(np.float64) @ q
    by_cosine = [rows.ids[i] for i in np.argsort(-cosine, kind="stable")]

    # A decayed config on a tier holding memories: start-up leaves it ranked by
    # similarity (logged), the reindex folds it.
    cfg = decayed_config(half_life_days=7.0)
    assert await ensure_indexes(pool, cfg) == []
    source = PgvectorSource(pool, lambda: cfg)
    assert [h.id for h in await source.search(query("sw", q, reference_time=NOW))] == by_cosine[:10]
    await rebuild_index(pool, cfg, "session")
    (epoch,) = await fold_state(pool)
    assert epoch.half_life_days == 7.0
    defs = await index_defs(pool)
    assert fold_index_name("session", epoch.epoch) in defs and "memories_hnsw_session" not in defs
    hits = await source.search(query("sw", q, limit=500, reference_time=NOW))
    assert [h.id for h in hits] == rows.top(q, 500, half_life=7.0)

    # A new half-life: a new epoch.
    cfg30 = decayed_config()
    await rebuild_index(pool, cfg30, "session")
    (epoch30,) = await fold_state(pool)
    assert epoch30.epoch > epoch.epoch and epoch30.half_life_days == HALF_LIFE
    hits = await PgvectorSource(pool, lambda: cfg30).search(query("sw", q, reference_time=NOW))
    assert [h.id for h in hits] == rows.top(q, 10)

    # Back to similarity: the cosine index returns, the fold goes.
    await rebuild_index(pool, similarity, "session")
    assert await fold_state(pool) == []
    defs = await index_defs(pool)
    assert "memories_hnsw_session" in defs and not any(n.startswith("memories_fold_") for n in defs)
    hits = await PgvectorSource(pool, lambda: similarity).search(query("sw", q, reference_time=NOW))
    assert [h.id for h in hits] == by_cosine[:10]
    assert hits[0].score == pytest.approx(cosine.max(), abs=1e-5)
    # Writes no longer fold.
    await PostgresStore(pool).write_memories("sw", [memory("sw-new", q)])
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT folded, fold_epoch FROM memories WHERE id = 'sw-new'")
        assert await cur.fetchone() == (None, None)


async def test_an_interrupted_first_fold_still_ranks_every_memory_by_the_objective(pool: AsyncConnectionPool) -> None:
    # Half of a similarity tier moved into its first epoch when the reindex
    # died: the rest comes from the cosine index, scored by the same objective.
    await ensure_indexes(pool, make_config())
    rows = await write_rows(pool, "half", 300, seed=21)
    cfg = decayed_config()
    async with pool.connection() as conn:
        epoch = await open_epoch(conn, "session", HALF_LIFE, filling=True)

        class Died(Exception):
            pass

        def die(moved: int) -> None:
            raise Died

        with pytest.raises(Died):
            await move_rows(conn, epoch, die, batch=150)
    source = PgvectorSource(pool, lambda: cfg)
    await ensure_indexes(pool, cfg)  # the epoch's index; the cosine one stays
    assert {fold_index_name("session", epoch.epoch), "memories_hnsw_session"} <= set(await index_defs(pool))
    for q in unit_vectors(np.random.default_rng(22), 5):
        hits = await source.search(query("half", q, limit=300, reference_time=NOW))
        assert [h.id for h in hits] == rows.top(q, 300)
        assert_scores(hits, rows, q)
    # The next reindex finishes it.
    await rebuild_index(pool, cfg, "session")
    (done,) = await fold_state(pool)
    assert done.epoch > epoch.epoch and not done.filling
    assert "memories_hnsw_session" not in await index_defs(pool)


async def test_a_reindex_with_the_same_fold_rebuilds_the_epochs_index_in_place(pool: AsyncConnectionPool) -> None:
    cfg = decayed_config(m=8, ef_construction=32)
    await ensure_indexes(pool, cfg)
    (epoch,) = await fold_state(pool)
    await write_rows(pool, "same", 200, seed=23)
    new_cfg = decayed_config(m=12, ef_construction=48)
    phases: list[object] = []
    await rebuild_index(pool, new_cfg, "session", progress=lambda p: phases.append(p["phase"]))
    assert phases == ["building", "done"]
    assert await fold_state(pool) == [epoch]
    assert "WITH (m='12', ef_construction='48')" in (await index_defs(pool))[fold_index_name("session", epoch.epoch)]


async def test_reload_names_the_fold_keys_as_needing_a_reindex(tmp_path: Any) -> None:
    path = tmp_path / "braid.yaml"
    path.write_text("tiers:\n  session: {holds: memories}\n  entities: {holds: entities}\n")
    from config import load_config

    engine = Engine(ConfigHolder(load_config(str(path)), str(path)), None, {}, None)  # type: ignore[arg-type]
    path.write_text(
        "tiers:\n  session: {holds: memories, objective: decayed, halfLifeDays: 7}\n  entities: {holds: entities}\n"
    )
    report = await engine.reload_config()
    assert report.reindex_required == ["tiers.session.halfLifeDays", "tiers.session.objective"]
    assert index_name("session", engine.config.current) == "memories_hnsw_session"


async def test_the_fold_watcher_recentres_a_tier_nearing_its_range(pool: AsyncConnectionPool) -> None:
    cfg = decayed_config()
    async with pool.connection() as conn:
        old = await open_epoch(conn, "session", HALF_LIFE, filling=False, anchor=NOW - timedelta(days=40 * HALF_LIFE))
    await ensure_indexes(pool, cfg)
    rows = await write_rows(pool, "wd", 300, seed=24)
    store = PostgresStore(pool)
    holder = ConfigHolder(cfg)
    async with anyio.create_task_group() as tg:

        def spawn(job: Callable[[], Coroutine[Any, Any, None]]) -> None:
            tg.start_soon(job)

        jobs = ReindexJobs(holder, store, None, None, spawn)  # type: ignore[arg-type]  # a pgvector job needs neither
        assert await jobs.folds_due() == ["session"]
        # Configured `similarity`, the tier is left alone (that change waits for an explicit reindex).
        holder.current = make_config()
        assert await jobs.folds_due() == []
        holder.current = cfg
        tg.start_soon(jobs.watch_folds, 0.05)
        with anyio.fail_after(60):
            while (live := await fold_state(pool)) == [old] or any(e.filling for e in live) or len(live) > 1:
                await anyio.sleep(0.05)
        assert await jobs.folds_due() == []
        tg.cancel_scope.cancel()
    (new,) = await fold_state(pool)
    assert new.epoch > old.epoch and new.exponent(datetime.now(UTC)) < 1.0
    q = unit_vectors(np.random.default_rng(25), 1)[0]
    hits = await PgvectorSource(pool, lambda: cfg).search(query("wd", q, reference_time=NOW))
    assert [h.id for h in hits] == rows.top(q, 10)


async def test_a_move_batch_that_deadlocks_with_a_write_is_tried_again(pool: AsyncConnectionPool) -> None:
    cfg = decayed_config()
    await ensure_indexes(pool, cfg)
    rows = await write_rows(pool, "dl", 40, seed=26)
    async with pool.connection() as conn:
        new = await open_epoch(conn, "session", HALF_LIFE, filling=True)
    first, later = sorted(rows.ids)[0], sorted(rows.ids)[20]
    writer = await psycopg.AsyncConnection.connect(pool.conninfo)
    moved: list[int] = []
    try:
        # The writer holds a row in the middle of the mover's batch...
        await writer.execute("UPDATE memories SET content = 'w1' WHERE tenant = 'dl' AND id = %s", (later,))

        async def mover() -> None:
            async with pool.connection() as conn:
                moved.append(await move_rows(conn, new))

        async with anyio.create_task_group() as tg:
            tg.start_soon(mover)
            # The mover holds the first rows and waits for `later`: its wait is seen.
            async with pool.connection() as watcher:
                with anyio.fail_after(30):
                    while True:
                        cur = await watcher.execute(
                            "SELECT count(*) FROM pg_locks WHERE NOT granted AND pid <> %s", (writer.info.backend_pid,)
                        )
                        row = await cur.fetchone()
                        if row and row[0]:
                            break
                        await anyio.sleep(0.02)
            # ...and then wants the first: a deadlock (found after deadlock_timeout, 1 s).
            # The mover waited first, so it detects it and is the one rolled back.
            await writer.execute("UPDATE memories SET content = 'w2' WHERE tenant = 'dl' AND id = %s", (first,))
            await writer.commit()
    finally:
        await writer.close()
    assert moved == [40]
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) FILTER (WHERE fold_epoch = %s), count(*) FILTER (WHERE content IN ('w1', 'w2'))"
            " FROM memories WHERE tenant = 'dl'",
            (new.epoch,),
        )
        assert await cur.fetchone() == (40, 2)


async def test_a_created_before_that_leaves_out_many_newer_rows_is_answered_exactly(
    pool: AsyncConnectionPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The index walk meets a folded tier's newest (largest) rows first: a
    # filter keeping only old memories would spend the walk's budget on rows
    # it rejects. Here the budget is 500 newer rows (WALK_AHEAD); exactBelow
    # 100 keeps the count alone from choosing the exact branch.
    import indexers.pgvector as pgvector

    monkeypatch.setattr(pgvector, "WALK_AHEAD", 500)
    cfg = decayed_config(exact_below=100, ef_construction=200, ef_search=400)
    await ensure_indexes(pool, cfg)
    rows = await write_rows(pool, "old", 3000, seed=27, days=200.0)
    log: list[dict[str, Any]] = []
    spy = await recording_pool(pool.conninfo, log)
    q = unit_vectors(np.random.default_rng(28), 1)[0]
    try:
        source = PgvectorSource(spy, lambda: cfg)
        for days, branch in ((50, "exact"), (2, "hnsw")):
            before = NOW - timedelta(days=days)
            kept = [i for i, t in enumerate(rows.created_at) if t <= before]
            assert len(kept) > 100 and (len(rows.ids) - len(kept) >= 500) == (branch == "exact")
            old = Rows(
                ids=[rows.ids[i] for i in kept],
                vectors=rows.vectors[kept],
                importance=[rows.importance[i] for i in kept],
                created_at=[rows.created_at[i] for i in kept],
            )
            log.clear()
            hits = await source.search(query("old", q, filters=Filters(created_before=before), reference_time=NOW))
            assert [h.id for h in hits] == old.top(q, 10)
            (search,) = folded_searches(log, 1)
            assert await explain_branch(pool, "old", search, 400) == branch
    finally:
        await spy.close()
