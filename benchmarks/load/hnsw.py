"""HNSW recall per tier: the index against an exact scan, over a grid of ef_search.

For each tier of a config, ``measure_hnsw`` reads the tier's rows for one
tenant (``memories`` of that tier, or ``entities`` for the entity tier),
computes the exact top-k of each query in numpy (cosine, float64, over every
row the service's filter admits), then asks the tier's HNSW index the same
question with the service's statement and settings (``set_search_params``:
``hnsw.ef_search`` per transaction, iterative scan ``relaxed_order``), once at
the ``efSearch`` the service uses for that index (``efSearchAt``'s step for
the index's ``reltuples``, else the tier's ``efSearch``) and once per
``ef_search`` of a grid. It reports
recall@k per ef, the p50 latency per ef and the smallest ef reaching 0.95 /
0.98 / 0.99, and checks with EXPLAIN that the planner really used the index.

The entity tier is asked with queries drawn around its own rows
(:func:`perturbed_rows`): the load corpus' memory vectors are synthetic and
lie far from the model's embeddings of entity names.

Recall counts ids: an approximate hit counts if its id is among the exact
top-k. Latency is per query, queries one after another on one connection, and
covers what the service pays per tier search: the transaction, the
``set_config`` round trip and the query.
"""

from __future__ import annotations

import json
import time
from collections.abc import Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg import register_vector_async

from config import BraidConfig
from indexers.own_index import own_index_name, read_own_indexes, tenant_sql
from indexers.pgvector import index_name, set_search_params

__all__ = [
    "DEFAULT_EF_GRID",
    "TARGETS",
    "ef_needed",
    "exact_top_k",
    "measure_hnsw",
    "perturbed_rows",
    "plan_uses_index",
    "plot_curves",
    "recall_at_k",
    "tier_vectors",
]

DEFAULT_EF_GRID: tuple[int, ...] = (10, 16, 24, 32, 48, 64, 96, 128, 192, 256, 400)
#: Recall levels for which the smallest sufficient ef_search is reported.
TARGETS: tuple[float, ...] = (0.95, 0.98, 0.99)
# Recalls are ratios of counts; this absorbs float rounding at a target (0.95).
_EPS = 1e-9
#: Noise norm of the entity tier's queries (the corpus' memory queries use 0.3).
ENTITY_QUERY_NOISE = 0.3
# Untimed queries run before a tier's first timed ef, so it does not pay for cold pages.
_WARMUP = 20


def recall_at_k(approx_ids: Sequence[Hashable], exact_ids: Sequence[Hashable], k: int = 10) -> float:
    """Share of the exact top-k (the first ``k`` of ``exact_ids``) found in the
    first ``k`` of ``approx_ids``. Duplicates in ``approx_ids`` count once."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    truth = set(exact_ids[:k])
    if not truth:
        raise ValueError("exact_ids is empty: recall is undefined")
    return len(truth.intersection(approx_ids[:k])) / len(truth)


def ef_needed(curve: Mapping[int, float], target: float) -> int | None:
    """The smallest ef_search of ``curve`` ({ef: recall}) whose recall is at
    least ``target``; ``None`` if no ef reaches it."""
    for ef in sorted(curve):
        if curve[ef] >= target - _EPS:
            return ef
    return None


def exact_top_k(vectors: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """Row indices of each query's ``k`` nearest rows by cosine distance,
    nearest first (ties by lower row index), shape ``(len(queries), k)``."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    x = np.asarray(vectors, dtype=np.float64)
    q = np.asarray(queries, dtype=np.float64)
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    q = q / np.linalg.norm(q, axis=1, keepdims=True)
    k = min(k, len(x))
    out = np.empty((len(q), k), dtype=np.int64)
    for start in range(0, len(q), 256):
        distance = 1.0 - q[start : start + 256] @ x.T
        for row, d in enumerate(distance, start):
            # Everything tied with the k-th distance is a candidate; a stable
            # sort of the candidates then breaks ties by row index.
            cut = np.partition(d, k - 1)[k - 1]
            candidates = np.flatnonzero(d <= cut)
            order = candidates[np.argsort(d[candidates], kind="stable")]
            out[row] = order[:k]
    return out


def plan_uses_index(plan: Any, name: str) -> bool:
    """Whether an ``EXPLAIN (FORMAT JSON)`` plan scans the index ``name``."""
    if isinstance(plan, dict):
        if plan.get("Index Name") == name:
            return True
        return any(plan_uses_index(v, name) for v in plan.values())
    if isinstance(plan, list):
        return any(plan_uses_index(v, name) for v in plan)
    return False


def _beside_walk(column: str, table: str, where: str, aside: str | None) -> str:
    """The ``%(limit)s`` rows of ``table`` matching ``where`` nearest to
    ``%(vec)s``: an index walk, and with ``aside`` (the flag of the rows the
    index leaves out) those rows compared exactly beside it."""
    alias = table.split()[-1]
    distance = f"{alias}.embedding <=> %(vec)s"
    walk = f"(SELECT {column}, {distance} AS distance FROM {table} WHERE {where}"
    branches = f"{walk} ORDER BY {distance} LIMIT %(limit)s)"
    if aside is not None:
        branches = (
            f"{walk} AND NOT {aside} ORDER BY {distance} LIMIT %(limit)s)"
            f" UNION ALL {walk} AND {aside} ORDER BY ({distance}) + 0 LIMIT %(limit)s)"
        )
    return f"""
        WITH nearest AS MATERIALIZED ({branches})
        SELECT id FROM nearest ORDER BY distance, id LIMIT %(limit)s
    """


def _statements(cfg: BraidConfig, tier: str, own: str | None = None) -> tuple[str, str, dict[str, Any]]:
    """(all rows, nearest rows, their parameters besides the vector): the
    nearest-rows statement is the one the service runs for this tier (for a
    tenant with an index of its own there, ``own`` is the tenant quoted: the
    service names it in the text)."""
    if tier == cfg.entity_tier:
        # indexers/graph.py: the entity seeds by vector, walking the index
        # that holds the entities not flagged small, the flagged ones
        # compared exactly beside the walk (indexers/postgres/unshared.py).
        return (
            "SELECT id, embedding FROM entities WHERE tenant = %(tenant)s",
            _beside_walk("e.id", "entities e", "e.tenant = %(tenant)s", "e.small"),
            {},
        )
    # indexers/pgvector.py: PgvectorSource._search_tier with no request filters.
    where = f"m.tenant = {tenant_sql(own)} AND m.confidence >= %(f_min_conf)s AND m.tier = '{tier}'"
    # A tenant without an index of its own walks the shared one, which holds
    # the rows not flagged own; its flagged rows (a small tenant's, or those
    # not moved in yet: indexers/postgres/unshared.py) are compared beside it.
    return (
        f"SELECT m.id, m.embedding FROM memories m WHERE {where}",
        _beside_walk("m.id", "memories m", where, None if own is not None else "m.own"),
        {"f_min_conf": cfg.min_confidence},
    )


async def tier_vectors(
    conn: psycopg.AsyncConnection[Any], cfg: BraidConfig, tier: str, tenant: str
) -> tuple[list[Any], np.ndarray]:
    """Ids and embeddings of every row a tier search of ``tenant`` may return
    (``conn`` must know the ``vector`` type: ``register_vector_async``)."""
    all_rows, _, extra = _statements(cfg, tier)  # the same rows, whichever index
    cur = await conn.execute(all_rows, {"tenant": tenant, **extra})
    rows = await cur.fetchall()
    if not rows:
        return [], np.empty((0, cfg.embedding.dim), dtype=np.float32)
    return [r[0] for r in rows], np.stack([_array(r[1]) for r in rows])


def _array(value: Any) -> np.ndarray:
    # Text results load as numpy arrays, binary ones as pgvector's ``Vector``.
    if hasattr(value, "to_numpy"):
        value = value.to_numpy()
    return np.asarray(value, dtype=np.float32)


async def _built_with(conn: psycopg.AsyncConnection[Any], name: str) -> dict[str, int] | None:
    cur = await conn.execute("SELECT reloptions FROM pg_class WHERE relname = %s", (name,))
    row = await cur.fetchone()
    if row is None:
        return None
    return {k: int(v) for k, _, v in (opt.partition("=") for opt in row[0] or [])}


async def _index_rows(conn: psycopg.AsyncConnection[Any], name: str) -> int:
    """``name``'s row count as the pgvector source reads it for ``efSearchAt``
    (``pg_class.reltuples``; never counted or absent reads as 0)."""
    cur = await conn.execute("SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE relname = %s", (name,))
    row = await cur.fetchone()
    return 0 if row is None else int(row[0])


async def _nearest(conn: psycopg.AsyncConnection[Any], statement: str, params: dict[str, Any], ef: int) -> list[Any]:
    async with conn.transaction():
        await set_search_params(conn, ef)
        cur = await conn.execute(statement, params)
        return [r[0] for r in await cur.fetchall()]


async def _uses_index(
    conn: psycopg.AsyncConnection[Any],
    statement: str,
    params: dict[str, Any],
    ef: int,
    name: str,
) -> bool:
    async with conn.transaction():
        await set_search_params(conn, ef)
        cur = await conn.execute(f"EXPLAIN (FORMAT JSON) {statement}", params)
        row = await cur.fetchone()
    plan = row[0] if row is not None else None
    return plan_uses_index(json.loads(plan) if isinstance(plan, str) else plan, name)


def perturbed_rows(vectors: np.ndarray, n: int, *, noise: float, seed: int) -> np.ndarray:
    """``n`` unit queries: random rows of ``vectors`` plus Gaussian noise of
    norm about ``noise``, re-normalised (seeded, so runs compare)."""
    rng = np.random.default_rng(seed)
    rows = np.asarray(vectors, dtype=np.float64)[rng.integers(0, len(vectors), size=n)]
    rows += rng.standard_normal(rows.shape) * noise / np.sqrt(rows.shape[1])
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


async def _measure_tier(
    conn: psycopg.AsyncConnection[Any],
    cfg: BraidConfig,
    tier: str,
    tenant: str,
    queries: np.ndarray,
    k: int,
    ef_grid: Iterable[int],
) -> dict[str, Any]:
    t = cfg.tiers[tier]
    # The index the service walks: the tenant's own in the tier, if it has one.
    own = None if tier == cfg.entity_tier else (await read_own_indexes(conn)).get((tenant, tier))
    name = index_name(tier, cfg) if own is None else own_index_name(tier, tenant)
    _, nearest, extra = _statements(cfg, tier, own)
    params: dict[str, Any] = {"tenant": tenant, "limit": k, **extra}
    ids, vectors = await tier_vectors(conn, cfg, tier, tenant)
    # The efSearch the service searches the index with: efSearchAt's step for its size.
    index_rows = await _index_rows(conn, name)
    ef_search = t.ef_search_for(index_rows) if t.holds == "memories" else t.ef_search
    base: dict[str, Any] = {
        "holds": t.holds,
        "index": name,
        "own_index": own is not None,
        "rows": len(ids),
        "index_rows": index_rows,
        "m": t.m,
        "ef_construction": t.ef_construction,
        "ef_search": ef_search,
        "ef_search_base": t.ef_search,
        "built_with": await _built_with(conn, name),
    }
    if len(ids) < k:
        return {**base, "skipped": f"{len(ids)} rows, fewer than k={k}"}
    if t.holds == "entities":
        # The corpus' memory vectors are synthetic while entity vectors are the
        # model's embeddings of names: a memory query sits far from every entity
        # (all distances near 1), an ill-posed neighbour search. Entities are
        # asked about with queries drawn like the memory ones, around their own rows.
        queries = perturbed_rows(vectors, len(queries), noise=ENTITY_QUERY_NOISE, seed=len(ids))
    truth = [[ids[i] for i in top] for top in exact_top_k(vectors, queries, k)]
    del vectors

    efs = sorted({int(ef) for ef in ef_grid} | {ef_search})
    curve: dict[int, float] = {}
    p50: dict[int, float] = {}
    used: dict[int, bool] = {}
    for qi in range(min(_WARMUP, len(queries))):  # pages into shared buffers
        await _nearest(conn, nearest, {**params, "vec": queries[qi]}, ef_search)
    for ef in efs:
        # pgvector's cost estimate grows with ef_search: the plan may change with it.
        used[ef] = await _uses_index(conn, nearest, {**params, "vec": queries[0]}, ef, name)
        hits = total = 0
        times: list[float] = []
        for qi, q in enumerate(queries):
            start = time.perf_counter()
            found = await _nearest(conn, nearest, {**params, "vec": q}, ef)
            times.append(time.perf_counter() - start)
            truth_q = truth[qi]
            hits += len(set(truth_q).intersection(found[:k]))
            total += len(truth_q)
        curve[ef] = hits / total
        p50[ef] = float(np.percentile(times, 50)) * 1000.0
    return {
        **base,
        "index_used": used[ef_search],
        "index_used_by_ef": used,
        "recall": curve[ef_search],
        "latency_p50_ms": p50[ef_search],
        "curve": curve,
        "latency_p50_ms_by_ef": p50,
        "ef_needed": {f"{target:.2f}": ef_needed(curve, target) for target in TARGETS},
    }


async def measure_hnsw(
    dsn: str,
    config: BraidConfig,
    tenant: str,
    queries: np.ndarray,
    k: int = 10,
    ef_grid: Iterable[int] = DEFAULT_EF_GRID,
    max_queries: int = 200,
) -> dict[str, Any]:
    """Recall@k and latency of every tier's HNSW index for one tenant.

    ``queries`` is a ``(n, dim)`` array; the first ``max_queries`` are used.
    Returns ``{"tenant", "k", "queries", "tiers": {tier: {...}}}``; a tier
    holding fewer than ``k`` rows has a ``skipped`` reason instead of numbers.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    q = np.asarray(queries, dtype=np.float32)
    if q.ndim != 2 or len(q) == 0:
        raise ValueError(f"queries must be a non-empty (n, dim) array, got shape {q.shape}")
    q = q[:max_queries]
    tiers: dict[str, Any] = {}
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await register_vector_async(conn)
        for tier in config.tiers:
            tiers[tier] = await _measure_tier(conn, config, tier, tenant, q, k, ef_grid)
    return {"tenant": tenant, "k": k, "queries": len(q), "tiers": tiers}


def plot_curves(result: Mapping[str, Any], path: Path) -> None:
    """Recall@k against ef_search per tier (left), p50 latency (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_l) = plt.subplots(1, 2, figsize=(12, 4.5))
    for tier, r in result["tiers"].items():
        if "skipped" in r:
            continue
        efs = sorted(int(ef) for ef in r["curve"])
        curve = {int(ef): v for ef, v in r["curve"].items()}
        lat = {int(ef): v for ef, v in r["latency_p50_ms_by_ef"].items()}
        label = f"{tier} (m={r['m']}, efC={r['ef_construction']}, {r['rows']} rows)"
        (line,) = ax_r.plot(efs, [curve[e] for e in efs], marker="o", ms=3, label=label)
        used = {int(ef): v for ef, v in r.get("index_used_by_ef", {}).items()}
        seq = [e for e in efs if not used.get(e, True)]
        if seq:  # exact sequential scans, not the graph
            ax_r.plot(seq, [curve[e] for e in seq], ls="", marker="o", ms=7, mfc="none", color=line.get_color())
        ax_r.plot([r["ef_search"]], [r["recall"]], marker="*", ms=12, color=line.get_color())
        ax_l.plot(efs, [lat[e] for e in efs], marker="o", ms=3, color=line.get_color(), label=tier)
        ax_l.plot([r["ef_search"]], [r["latency_p50_ms"]], marker="*", ms=12, color=line.get_color())
    for target in TARGETS:
        ax_r.axhline(target, color="grey", lw=0.8, ls="--")
        ax_r.annotate(
            f"{target:.2f}",
            (1.0, target),
            xycoords=("axes fraction", "data"),
            fontsize=7,
            color="grey",
            ha="right",
            va="bottom",
        )
    k = result.get("k", 10)
    ax_r.set(
        xscale="log",
        xlabel="hnsw.ef_search",
        ylabel=f"recall@{k}",
        title=f"recall@{k} vs exact ({result.get('queries')} queries; * configured, o seq scan)",
    )
    ax_l.set(
        xscale="log",
        xlabel="hnsw.ef_search",
        ylabel="p50 latency per query (ms)",
        title="latency (sequential, one connection)",
    )
    ax_r.legend(fontsize=7, loc="lower right")
    ax_l.legend(fontsize=7)
    for ax in (ax_r, ax_l):
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
