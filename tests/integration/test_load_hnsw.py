"""The HNSW recall benchmark against the real embedded Postgres 18 + pgvector.

One database holds one tenant's 20k memories (12k session, 8k rag) and 3k
entities, 384-d like the shipped model. The vectors are clustered on purpose:
uniform noise in 384-d has no near neighbours to find. Each cluster is a
centre plus a spread inside its own 12-d subspace plus a little isotropic
noise, which gives neighbourhoods with a low intrinsic dimension, as real
sentence embeddings have. Queries are fresh draws from the same clusters.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import msgspec
import numpy as np
import psycopg
import pytest
from pgvector.psycopg import register_vector_async

from benchmarks.load.hnsw import exact_top_k, measure_hnsw, tier_vectors
from config import BraidConfig, load_config
from config.schema import EfStep
from deploy.embedded import EmbeddedPostgres
from indexers.own_index import own_index_name, place_indexes
from indexers.pgvector import ensure_indexes
from indexers.postgres import open_pool
from tests.api.conftest import fresh_database

pytestmark = pytest.mark.anyio

DIM = 384
TENANT = "load"
SMALL_TENANT = "tiny"
SIZES = {"session": 12_000, "rag": 8_000}
ENTITIES = 3_000
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
GRID = (10, 16, 24, 48, 96, 192, 400)


class Clusters(msgspec.Struct):
    centres: np.ndarray  # (c, dim)
    bases: np.ndarray  # (c, sub, dim)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        c = rng.integers(0, len(self.centres), n)
        spread = np.einsum("ns,nsd->nd", rng.standard_normal((n, self.bases.shape[1])), self.bases[c])
        v = self.centres[c] + 0.35 * spread + 0.02 * rng.standard_normal((n, DIM))
        return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def make_clusters(rng: np.random.Generator, n: int = 200, sub: int = 12) -> Clusters:
    centres = rng.standard_normal((n, DIM))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    bases = np.linalg.qr(rng.standard_normal((n, DIM, sub)))[0].transpose(0, 2, 1)
    return Clusters(centres=centres, bases=bases)


async def load_corpus(dsn: str, tenant: str, vectors: dict[str, np.ndarray], entities: np.ndarray) -> None:
    """Memories per tier and entities by binary COPY (no outbox: nothing syncs)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await register_vector_async(conn)
        async with conn.cursor() as cur:
            async with cur.copy(
                "COPY memories (tenant, id, content, kind, tier, created_at, embedding, model)"
                " FROM STDIN WITH (FORMAT BINARY)"
            ) as copy:
                copy.set_types(["text"] * 5 + ["timestamptz", "vector", "text"])
                for tier, vs in vectors.items():
                    for i, v in enumerate(vs):
                        mid = f"{tier}-{i}"
                        await copy.write_row((tenant, mid, f"memory {mid}", "note", tier, T0, v, "synthetic"))
            async with cur.copy(
                "COPY entities (tenant, name, name_norm, embedding, model) FROM STDIN WITH (FORMAT BINARY)"
            ) as copy:
                copy.set_types(["text", "text", "text", "vector", "text"])
                for i, v in enumerate(entities):
                    await copy.write_row((tenant, f"E{i}", f"e{i}", v, "synthetic"))
        await conn.execute("ANALYZE memories")
        await conn.execute("ANALYZE entities")


async def build(dsn: str, cfg: BraidConfig, seed: int = 20240501) -> Clusters:
    """The schema, the corpus of TENANT (and 5 rows of SMALL_TENANT), the indexes."""
    rng = np.random.default_rng(seed)
    clusters = make_clusters(rng)
    pool = await open_pool(dsn, dim=DIM, min_size=1, max_size=2)
    try:
        await load_corpus(
            dsn,
            TENANT,
            {t: clusters.draw(rng, n) for t, n in SIZES.items()},
            clusters.draw(rng, ENTITIES),
        )
        await load_corpus(dsn, SMALL_TENANT, {"session": clusters.draw(rng, 5)}, clusters.draw(rng, 0))
        await ensure_indexes(pool, cfg)
    finally:
        await pool.close()
    return clusters


@pytest.fixture(scope="module")
def cfg() -> BraidConfig:
    cfg = load_config()
    assert cfg.embedding.dim == DIM
    return cfg


@pytest.fixture(scope="module")
async def loaded(postgres: EmbeddedPostgres, cfg: BraidConfig) -> AsyncIterator[tuple[str, Clusters]]:
    dsn = fresh_database(postgres)
    yield dsn, await build(dsn, cfg)


@pytest.fixture(scope="module")
async def result(loaded: tuple[str, Clusters], cfg: BraidConfig) -> dict:  # type: ignore[type-arg]
    dsn, clusters = loaded
    queries = clusters.draw(np.random.default_rng(99), 100)
    return await measure_hnsw(dsn, cfg, TENANT, queries, k=10, ef_grid=GRID, max_queries=80)


async def test_every_tier_is_measured_with_its_config(result: dict, cfg: BraidConfig) -> None:  # type: ignore[type-arg]
    print(result)  # the numbers, for `pytest -s`
    assert result["k"] == 10
    assert result["queries"] == 80
    assert set(result["tiers"]) == set(cfg.tiers)
    rows = {"session": SIZES["session"], "rag": SIZES["rag"], "entities": ENTITIES}
    for tier, r in result["tiers"].items():
        t = cfg.tiers[tier]
        assert "skipped" not in r
        assert r["rows"] == rows[tier]
        assert (r["m"], r["ef_construction"], r["ef_search"]) == (t.m, t.ef_construction, t.ef_search)
        assert r["built_with"] == {"m": t.m, "ef_construction": t.ef_construction}
        assert sorted(r["curve"]) == sorted(set(GRID) | {t.ef_search})
        assert r["recall"] == r["curve"][t.ef_search]
        assert r["latency_p50_ms"] == r["latency_p50_ms_by_ef"][t.ef_search]
        assert set(r["ef_needed"]) == {"0.95", "0.98", "0.99"}


async def test_explain_shows_each_tiers_hnsw_index(result: dict) -> None:  # type: ignore[type-arg]
    tiers = result["tiers"]
    for tier in ("session", "rag"):
        assert set(tiers[tier]["index_used_by_ef"].values()) == {True}, tier
        assert tiers[tier]["index_used"] is True
    # 3k entities: pgvector's cost estimate grows with ef_search, and from some
    # ef on the planner prefers a sequential scan; at ef_search 10 it takes the index.
    entities = tiers["entities"]["index_used_by_ef"]
    assert entities[10] is True
    assert tiers["entities"]["index_used"] == entities[128]


async def test_recall_is_a_share_and_grows_with_ef_search(result: dict) -> None:  # type: ignore[type-arg]
    for tier, r in result["tiers"].items():
        curve = r["curve"]
        assert all(0.0 <= v <= 1.0 for v in curve.values()), (tier, curve)
        assert curve[max(curve)] >= curve[min(curve)], (tier, curve)
        # At ef_search 400 over at most 12k rows the graph finds nearly everything;
        # a wrong id mapping or a wrong truth would show as recall far below.
        assert curve[max(curve)] >= 0.9, (tier, curve)
        assert all(v > 0 for v in r["latency_p50_ms_by_ef"].values())
        for target, ef in r["ef_needed"].items():
            assert ef is None or curve[ef] >= float(target) - 1e-9


async def test_exact_search_of_a_stored_vector_returns_itself_first(
    loaded: tuple[str, Clusters], cfg: BraidConfig
) -> None:
    dsn, _ = loaded
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await register_vector_async(conn)
        for tier in ("session", "entities"):
            ids, vectors = await tier_vectors(conn, cfg, tier, TENANT)
            picks = [0, len(ids) // 2, len(ids) - 1]
            top = exact_top_k(vectors, vectors[picks], 10)
            assert [ids[row[0]] for row in top] == [ids[p] for p in picks]


async def test_a_tier_with_fewer_than_k_rows_is_skipped(loaded: tuple[str, Clusters], cfg: BraidConfig) -> None:
    dsn, clusters = loaded
    queries = clusters.draw(np.random.default_rng(1), 3)
    out = await measure_hnsw(dsn, cfg, SMALL_TENANT, queries, k=10, ef_grid=(10,))
    assert {t: r.get("skipped") for t, r in out["tiers"].items()} == {
        "session": "5 rows, fewer than k=10",
        "entities": "0 rows, fewer than k=10",
        "rag": "0 rows, fewer than k=10",
    }
    assert out["tiers"]["session"]["rows"] == 5


async def test_a_tier_is_measured_at_the_ef_search_its_index_size_gets(
    loaded: tuple[str, Clusters], cfg: BraidConfig
) -> None:
    # The service searches an index of at least a step's rows with that
    # step's efSearch (efSearchAt): the recall reported is at that one.
    dsn, clusters = loaded
    session = msgspec.structs.replace(cfg.tiers["session"], ef_search_at=(EfStep(rows=10_000, ef_search=64),))
    rag = msgspec.structs.replace(cfg.tiers["rag"], ef_search_at=(EfStep(rows=50_000, ef_search=300),))
    stepped = msgspec.structs.replace(cfg, tiers={**cfg.tiers, "session": session, "rag": rag})
    out = await measure_hnsw(dsn, stepped, TENANT, clusters.draw(np.random.default_rng(6), 20), k=10, ef_grid=(10,))
    s, r = out["tiers"]["session"], out["tiers"]["rag"]
    assert s["index_rows"] >= SIZES["session"]  # the shared index: the small tenant's rows too
    assert (s["ef_search"], s["ef_search_base"]) == (64, cfg.tiers["session"].ef_search)
    assert s["recall"] == s["curve"][64] and s["latency_p50_ms"] == s["latency_p50_ms_by_ef"][64]
    # 8,000 rows: under its only step, the tier's own efSearch.
    assert (r["ef_search"], r["ef_search_base"]) == (cfg.tiers["rag"].ef_search,) * 2
    assert sorted(r["curve"]) == sorted({10, cfg.tiers["rag"].ef_search})


async def test_a_tenant_with_its_own_indexes_is_measured_on_them(
    loaded: tuple[str, Clusters], cfg: BraidConfig
) -> None:
    # Runs last in the module: it adds indexes the tests above do not expect.
    dsn, clusters = loaded

    async def report(update: dict[str, Any]) -> None:
        pass

    pool = await open_pool(dsn, dim=DIM, min_size=1, max_size=2)
    try:
        await place_indexes(pool, cfg, report)  # both tiers hold 5000 or more
    finally:
        await pool.close()
    out = await measure_hnsw(dsn, cfg, TENANT, clusters.draw(np.random.default_rng(5), 40), k=10, ef_grid=(10, 400))
    for tier in ("session", "rag"):
        r = out["tiers"][tier]
        assert (r["own_index"], r["index"]) == (True, own_index_name(tier, TENANT))
        assert r["rows"] == SIZES[tier]
        assert set(r["index_used_by_ef"].values()) == {True}, tier
        assert r["built_with"] == {"m": cfg.tiers[tier].m, "ef_construction": cfg.tiers[tier].ef_construction}
        assert r["curve"][400] >= 0.9, (tier, r["curve"])
    assert out["tiers"]["entities"]["own_index"] is False
