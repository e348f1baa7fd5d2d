"""The decay fold as an index: recall@10 of a decayed tier's inner-product
HNSW index against the exact objective, beside the plain cosine index.

For each ``--size``, an embedded Postgres of its own (under ``--home``) gets
one tenant's synthetic memories in the ``session`` tier, loaded with ``COPY``
(not through HTTP: this measures the index): 384-d unit vectors around
Gaussian centres (as the load benchmark's), ages uniform over ``--days``,
importance uniform in 0-1 (a fifth without one, weighing 0.5). The fold is
recorded as the service records it (one epoch anchored at the run's reference
time) and ``folded`` is computed by :func:`indexers.postgres.fold.fold_vectors`,
as a write does. Both indexes are built with the tier's m / efConstruction.

Truth is numpy's float64 computation over every row: cosine top-10 for the
cosine index, ``cosine x w x exp(-λ age)`` top-10 for the fold. The searches
are the statements the pgvector source runs (``search_plans``; exactBelow
2000, iterative scan), one query at a time on one connection, timed with
their transaction and ``set_config`` round trip. Then, per size: the source's
own ``search`` once per objective (its extra round trip reads the folds), and
with ``--recentre`` a re-centring through ``rebuild_index`` (rows moved into a
new epoch, its index filled by inserts) and that index's recall.

Results accumulate per size in ``benchmarks/results/decay-fold.json``; the
Markdown and the PNG are redrawn from all sizes recorded.

    python -m benchmarks.decay_fold --size 100000 --recentre
    python -m benchmarks.decay_fold --size 1000000 --maintenance-work-mem 3GB
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shutil
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import psycopg
from pgvector.psycopg import register_vector_async

from benchmarks.common import RESULTS, pyplot, write_results
from config import BraidConfig, TierConfig, load_config
from deploy.embedded import EmbeddedPostgres
from indexers.base import Filters, SearchQuery
from indexers.pgvector import (
    WALK_AHEAD,
    PgvectorSource,
    SearchPlan,
    ensure_indexes,
    index_ddl,
    index_name,
    rebuild_index,
    search_plans,
    set_search_params,
)
from indexers.postgres import filter_clause, open_pool
from indexers.postgres.fold import (
    NEUTRAL_IMPORTANCE,
    Epoch,
    decay_rate,
    fold_index_ddl,
    fold_index_name,
    fold_vectors,
    read_epochs,
)

DIM = 384
TENANT = "bench"
TIER = "session"
K = 10
EF_GRID = (40, 64, 100, 200)
NAME = "decay-fold"
_WARMUP = 20
_START = time.monotonic()


def say(message: str) -> None:
    print(f"[{time.monotonic() - _START:8.1f} s] {message}", flush=True)


def bench_config(half_life_days: float) -> BraidConfig:
    cfg = load_config()
    session = msgspec.structs.replace(cfg.tiers[TIER], objective="decayed", half_life_days=half_life_days)
    return msgspec.structs.replace(
        cfg, embedding=msgspec.structs.replace(cfg.embedding, dim=DIM), tiers={**cfg.tiers, TIER: session}
    )


class Corpus(msgspec.Struct):
    vectors: np.ndarray  # (n, DIM) float32, unit
    weights: np.ndarray  # importance weight, float64
    importance: np.ndarray  # as stored (nan: none), float32
    age_s: np.ndarray  # seconds before the reference time, oldest first
    queries: np.ndarray


def make_corpus(n: int, *, days: float, queries: int, seed: int, clusters: int = 200) -> Corpus:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, DIM))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    vectors = np.empty((n, DIM), dtype=np.float32)
    for start in range(0, n, 100_000):
        m = min(100_000, n - start)
        v = centres[rng.integers(0, clusters, m)] + rng.standard_normal((m, DIM)) / np.sqrt(DIM)
        vectors[start : start + m] = v / np.linalg.norm(v, axis=1, keepdims=True)
    # Loaded oldest first, as memories arrive.
    age_s = np.sort(rng.uniform(0, days * 86_400.0, n))[::-1].copy()
    importance = rng.random(n).astype(np.float32)
    importance[rng.random(n) < 0.2] = np.nan
    weights = np.where(np.isnan(importance), NEUTRAL_IMPORTANCE, importance.astype(np.float64))
    targets = rng.integers(0, n, queries)
    q = vectors[targets].astype(np.float64) + rng.standard_normal((queries, DIM)) * 0.3 / np.sqrt(DIM)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return Corpus(vectors, weights, importance, age_s, q.astype(np.float32))


def exact_tops(c: Corpus, rate: float | None, admitted: np.ndarray | None = None) -> list[list[int]]:
    """Each query's top-K row numbers by cosine (``rate`` None) or by the
    objective, float64 over every row (``admitted``: those rows only); ties
    by row number."""
    q = c.queries.astype(np.float64)
    factor = None if rate is None else c.weights * np.exp(-rate * c.age_s)
    best: list[list[tuple[float, int]]] = [[] for _ in range(len(q))]
    for start in range(0, len(c.vectors), 50_000):
        s = c.vectors[start : start + 50_000].astype(np.float64) @ q.T
        if factor is not None:
            s *= factor[start : start + 50_000, None]
        if admitted is not None:
            s[~admitted[start : start + 50_000]] = -np.inf
        top = np.argpartition(-s, K, axis=0)[: K + 1]
        for j in range(len(q)):
            best[j].extend((float(s[i, j]), start + int(i)) for i in top[:, j])
    return [[i for _, i in sorted(b, key=lambda t: (-t[0], t[1]))[:K]] for b in best]


async def load(conn: psycopg.AsyncConnection[Any], c: Corpus, epoch: Epoch, reference: datetime) -> float:
    began = time.perf_counter()
    async with conn.cursor() as cur:
        for start in range(0, len(c.vectors), 20_000):
            stop = min(start + 20_000, len(c.vectors))
            created = [reference - timedelta(seconds=float(a)) for a in c.age_s[start:stop]]
            folded = fold_vectors(
                c.vectors[start:stop],
                c.weights[start:stop],
                np.array([(t - epoch.anchor).total_seconds() for t in created]),
                epoch.rate,
            )
            async with cur.copy(
                "COPY memories (tenant, id, content, kind, tier, importance, confidence, created_at,"
                " embedding, model, folded, fold_epoch) FROM STDIN WITH (FORMAT BINARY)"
            ) as copy:
                copy.set_types(
                    ["text", "text", "text", "text", "text", "float4", "float4", "timestamptz"]
                    + ["vector", "text", "vector", "int4"]
                )
                for k, i in enumerate(range(start, stop)):
                    imp = None if math.isnan(c.importance[i]) else float(c.importance[i])
                    await copy.write_row(
                        (TENANT, f"m{i:07d}", f"memory {i}", "note", TIER, imp, 1.0, created[k])
                        + (c.vectors[i], "synthetic", folded[k], epoch.epoch)
                    )
            if stop % 100_000 == 0 or stop == len(c.vectors):
                say(f"loaded {stop} rows")
    # The steady state autovacuum gives a service (visibility map set).
    await conn.execute("VACUUM ANALYZE memories")
    return time.perf_counter() - began


async def build(conn: psycopg.AsyncConnection[Any], ddl: str, name: str, mwm: str) -> dict[str, Any]:
    say(f"building {name}")
    await conn.execute(f"SET maintenance_work_mem = '{mwm}'")
    began = time.perf_counter()
    await conn.execute(ddl)
    seconds = time.perf_counter() - began
    await conn.execute("RESET maintenance_work_mem")
    size = await one(conn, "SELECT pg_relation_size(%s::regclass)", (name,))
    say(f"built {name} in {seconds:.1f} s, {size / 2**20:.0f} MB")
    return {"index": name, "build_s": seconds, "index_mb": size / 2**20}


async def one(conn: psycopg.AsyncConnection[Any], sql: str, params: Any = None) -> Any:
    row = await (await conn.execute(sql, params)).fetchone()
    assert row is not None
    return row[0]


def tier_plan(
    cfg: BraidConfig, live: list[Epoch], reference: datetime, filters: Filters | None = None
) -> tuple[SearchPlan, dict[str, Any]]:
    filters = filters or Filters()
    where, params = filter_clause(filters, min_confidence=cfg.min_confidence, memory_tiers=cfg.memory_tiers, tier=TIER)
    ahead = None
    if filters.created_before is not None:  # as PgvectorSource builds it
        ahead = f"m.tenant = %(tenant)s AND m.tier = '{TIER}' AND m.created_at > %(f_before)s"
        params["walk_ahead"] = WALK_AHEAD
    # A tenant without an index of its own: the shared index, the flagged rows beside it.
    (plan,) = search_plans(f"m.tenant = %(tenant)s AND {where}", live, reference, ahead, "m.own")
    params.update({"tenant": TENANT, "limit": K, "exact_below": cfg.tiers[TIER].exact_below})
    return plan, params


def _scans(node: Any, name: str) -> list[dict[str, Any]]:
    if isinstance(node, dict):
        own = [node] if node.get("Index Name") == name else []
        return own + [s for v in node.values() for s in _scans(v, name)]
    if isinstance(node, list):
        return [s for v in node for s in _scans(v, name)]
    return []


async def uses_index(
    conn: psycopg.AsyncConnection[Any], plan: SearchPlan, params: dict[str, Any], ef: int, name: str
) -> bool:
    """Whether the statement's HNSW branch ran on ``name`` (not the exact branch)."""
    async with conn.transaction():
        await set_search_params(conn, ef)
        explained = await one(conn, f"EXPLAIN (ANALYZE, FORMAT JSON) {plan.statement}", params)
    tree = json.loads(explained) if isinstance(explained, str) else explained
    return any(s.get("Actual Loops", 0) > 0 for s in _scans(tree, name))


async def grid(
    conn: psycopg.AsyncConnection[Any],
    plan: SearchPlan,
    params: dict[str, Any],
    c: Corpus,
    truth: list[list[int]],
    name: str,
) -> dict[str, Any]:
    for q in c.queries[:_WARMUP]:
        async with conn.transaction():
            await set_search_params(conn, EF_GRID[0])
            await conn.execute(plan.statement, {**params, "vec": q})
    out: dict[str, Any] = {"recall": {}, "p50_ms": {}, "index_used": {}, "short": {}}
    for ef in EF_GRID:
        out["index_used"][ef] = await uses_index(conn, plan, {**params, "vec": c.queries[0]}, ef, name)
        hits, times, short = 0, [], 0
        for q, top in zip(c.queries, truth, strict=True):
            began = time.perf_counter()
            async with conn.transaction():
                await set_search_params(conn, ef)
                rows = await (await conn.execute(plan.statement, {**params, "vec": q})).fetchall()
            times.append(time.perf_counter() - began)
            found = {int(r[0][1:]) for r in rows[:K]}  # ids are m<row>
            hits += len(found.intersection(top))
            short += len(rows) < K
        out["short"][ef] = short
        out["recall"][ef] = hits / (K * len(truth))
        out["p50_ms"][ef] = float(np.percentile(times, 50)) * 1000
        say(f"{name} ef_search {ef}: recall@10 {out['recall'][ef]:.3f}, p50 {out['p50_ms'][ef]:.2f} ms")
    return out


async def source_p50(dsn: str, cfg: BraidConfig, c: Corpus, reference: datetime) -> float:
    """PgvectorSource.search (every memory tier, the folds read first) at the tier's efSearch."""
    pool = await open_pool(dsn, dim=DIM, min_size=1, max_size=2)
    try:
        source = PgvectorSource(pool, lambda: cfg)
        times = []
        for i, q in enumerate(c.queries):
            began = time.perf_counter()
            hits = await source.search(
                SearchQuery(
                    tenant=TENANT,
                    text="",
                    vector=tuple(map(float, q)),
                    limit=K,
                    reference_time=reference,
                    model="synthetic",
                )
            )
            if i >= _WARMUP:
                times.append(time.perf_counter() - began)
            assert len(hits) == K
        return float(np.percentile(times, 50)) * 1000
    finally:
        await pool.close()


async def run_size(args: argparse.Namespace, size: int) -> dict[str, Any]:
    cfg = bench_config(args.half_life)
    t: TierConfig = cfg.tiers[TIER]
    home = Path(args.home) / f"size-{size}"
    shutil.rmtree(home, ignore_errors=True)
    pg = EmbeddedPostgres(home / "postgres")
    say(f"size {size}: starting Postgres under {home}")
    base_dsn = pg.start()
    try:
        with psycopg.connect(base_dsn, autocommit=True) as admin:
            admin.execute("CREATE DATABASE fold")
        dsn = base_dsn.replace("/postgres?", "/fold?")
        say("making the corpus")
        c = make_corpus(size, days=args.days, queries=args.queries, seed=args.seed)
        # The fold as the service records it for a new tier (ensure_indexes), anchored now.
        pool = await open_pool(dsn, dim=DIM, min_size=1, max_size=4)
        await ensure_indexes(pool, cfg)
        async with pool.connection() as conn:
            (epoch,) = (await read_epochs(conn))[TIER]
            await conn.execute(f"DROP INDEX {fold_index_name(TIER, epoch.epoch)}")
            await conn.execute(f"DROP INDEX IF EXISTS {index_name(TIER, cfg)}")
        await pool.close()
        reference = epoch.anchor
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        await register_vector_async(conn)
        say(f"loading {size} rows (fold epoch {epoch.epoch}, anchor {epoch.anchor.isoformat()})")
        load_s = await load(conn, c, epoch, reference)
        heap_mb = await one(conn, "SELECT pg_table_size('memories')") / 2**20
        say("exact top-10s (numpy, float64)")
        truth_cos = exact_tops(c, None)
        truth_obj = exact_tops(c, decay_rate(args.half_life))
        fold_name = fold_index_name(TIER, epoch.epoch)
        cos_name = index_name(TIER, cfg)
        result: dict[str, Any] = {
            "size": size,
            "rows_loaded_s": load_s,
            "table_mb": heap_mb,
            "m": t.m,
            "ef_construction": t.ef_construction,
            "maintenance_work_mem": args.maintenance_work_mem,
            "half_life_days": args.half_life,
            "days": args.days,
            "queries": args.queries,
            "seed": args.seed,
        }
        result["similarity"] = await build(
            conn, index_ddl(TIER, cfg, cos_name, concurrently=False), cos_name, args.maintenance_work_mem
        )
        result["decayed"] = await build(
            conn,
            fold_index_ddl(TIER, epoch.epoch, t, fold_name, concurrently=False),
            fold_name,
            args.maintenance_work_mem,
        )
        plan, params = tier_plan(cfg, [], reference)
        result["similarity"].update(await grid(conn, plan, params, c, truth_cos, cos_name))
        plan, params = tier_plan(cfg, [epoch], reference)
        result["decayed"].update(await grid(conn, plan, params, c, truth_obj, fold_name))

        if args.filtered:
            # Only memories older than `filtered` days: far more than exactBelow,
            # so the index answers, through the iterative scan.
            old = c.age_s >= args.filtered * 86_400.0
            filters = Filters(created_before=reference - timedelta(days=args.filtered))
            say(f"filtered: the {int(old.sum())} memories older than {args.filtered:g} days")
            result["filtered"] = {"days": args.filtered, "rows": int(old.sum())}
            for mode, live, rate, name in (
                ("similarity", [], None, cos_name),
                ("decayed", [epoch], decay_rate(args.half_life), fold_name),
            ):
                plan, params = tier_plan(cfg, live, reference, filters)
                result["filtered"][mode] = await grid(conn, plan, params, c, exact_tops(c, rate, old), name)

        say("PgvectorSource.search p50, decayed then similarity")
        result["decayed"]["source_p50_ms"] = await source_p50(dsn, cfg, c, reference)
        await conn.execute("DELETE FROM fold_epochs")
        result["similarity"]["source_p50_ms"] = await source_p50(dsn, cfg, c, reference)
        await conn.execute(
            "INSERT INTO fold_epochs (tier, epoch, half_life_days, anchor) VALUES (%s, %s, %s, %s)",
            (TIER, epoch.epoch, epoch.half_life_days, epoch.anchor),
        )

        if args.recentre:
            # A decayed tier has no cosine index in service: moving a row would
            # also insert into it.
            await conn.execute(f"DROP INDEX {cos_name}")
            say("re-centring through rebuild_index (rows moved into a new epoch)")
            pool = await open_pool(dsn, dim=DIM, min_size=1, max_size=4)
            began = time.perf_counter()
            last = [0.0]

            def note(p: dict[str, object]) -> None:
                if p.get("phase") != "moving" or time.perf_counter() - last[0] > 30:
                    last[0] = time.perf_counter()
                    say(f"re-centre: {p}")

            await rebuild_index(pool, cfg, TIER, progress=note, recentre=True)
            seconds = time.perf_counter() - began
            async with pool.connection() as pc:
                (new,) = (await read_epochs(pc))[TIER]
            await pool.close()
            name = fold_index_name(TIER, new.epoch)
            rc: dict[str, Any] = {"index": name, "seconds": seconds, "rows_per_s": size / seconds}
            rc["index_mb"] = await one(conn, "SELECT pg_relation_size(%s::regclass)", (name,)) / 2**20
            plan, params = tier_plan(cfg, [new], reference)
            rc.update(await grid(conn, plan, params, c, truth_obj, name))
            result["recentred"] = rc
        await conn.close()
        return result
    finally:
        pg.stop()
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)


def report(data: dict[str, Any]) -> str:
    runs = [data["runs"][k] for k in sorted(data["runs"], key=int)]
    efs = [str(ef) for ef in EF_GRID]
    lines = [
        "# The decay fold: recall of the folded inner-product HNSW index",
        "",
        "Command: `make bench-fold` (`python -m benchmarks.decay_fold --size 100000 --recentre`), "
        "`python -m benchmarks.decay_fold --size 1000000 --maintenance-work-mem 3GB`  ",
        "Machine: 2 cores shared with two other engineers' work (timings are noisy).  ",
        "Corpus: one tenant, tier `session`; 384-d unit vectors around 200 Gaussian centres (noise norm ~1), "
        "ages uniform over the last `days`, loaded oldest first with COPY; importance uniform 0-1, a fifth "
        "without (weight 0.5); queries = corpus vectors perturbed by noise norm ~0.3.  ",
        "Truth: numpy float64 over every row: cosine top-10 (similarity) and cosine x w x exp(-λ age) "
        "top-10 (decayed). Searches: the pgvector source's statements (`search_plans`: bounded count, "
        "HNSW branch, iterative scan), one query at a time, p50 with the transaction and the `set_config` "
        "round trip.",
        "",
        "| size | objective | m / efC | half-life d / ages d | build s | index MB | "
        + " | ".join(f"R@10 ef {e}" for e in efs)
        + " | "
        + " | ".join(f"p50 ms ef {e}" for e in efs)
        + " | index used | source p50 ms (efSearch 48) |",
        "|" + "---|" * (8 + 2 * len(efs)),
    ]
    for r in runs:
        for mode in ("similarity", "decayed", "recentred"):
            if mode not in r:
                continue
            x = r[mode]
            build = f"{x['build_s']:.0f}" if "build_s" in x else f"{x['seconds']:.0f} (moved)"
            lines.append(
                f"| {r['size']} | {mode} | {r['m']} / {r['ef_construction']} | {r['half_life_days']:g} / {r['days']:g} "
                f"| {build} | {x['index_mb']:.0f} | "
                + " | ".join(f"{x['recall'][e]:.3f}" for e in efs)
                + " | "
                + " | ".join(f"{x['p50_ms'][e]:.2f}" for e in efs)
                + f" | {all(x['index_used'].values())} | "
                + (f"{x['source_p50_ms']:.2f}" if "source_p50_ms" in x else "–")
                + " |"
            )
    filtered = [r for r in runs if "filtered" in r]
    if filtered:
        lines += [
            "",
            "Filtered: `created_before` = the reference time minus `days` (only old memories, far more than "
            "exactBelow, so the HNSW branch answers with the iterative scan); truth over those rows only; "
            "`short` = queries answered with fewer than 10 hits.",
            "",
            "| size | objective | days / rows | "
            + " | ".join(f"R@10 ef {e}" for e in efs)
            + " | "
            + " | ".join(f"short ef {e}" for e in efs)
            + " | "
            + " | ".join(f"p50 ms ef {e}" for e in efs)
            + " |",
            "|" + "---|" * (3 + 3 * len(efs)),
        ]
        for r in filtered:
            f = r["filtered"]
            for mode in ("similarity", "decayed"):
                x = f[mode]
                lines.append(
                    f"| {r['size']} | {mode} | {f['days']:g} / {f['rows']} | "
                    + " | ".join(f"{x['recall'][e]:.3f}" for e in efs)
                    + " | "
                    + " | ".join(str(x["short"][e]) for e in efs)
                    + " | "
                    + " | ".join(f"{x['p50_ms'][e]:.2f}" for e in efs)
                    + " |"
                )
    lines += [
        "",
        "`recentred`: the same fold after `rebuild_index(..., recentre=True)`: a new epoch anchored at the "
        "server's clock, its index created empty and filled as `move_rows` moved every row into it "
        "(one UPDATE each, batches of 500); `build s` is that whole step.",
        "",
        "| size | rows | COPY load s | table MB (heap + TOAST) | maintenance_work_mem |",
        "|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r['size']} | {r['size']} | {r['rows_loaded_s']:.0f} | {r['table_mb']:.0f} | {r['maintenance_work_mem']} |"
        )
    for key in ("notes", "quality"):
        if data.get(key):
            lines += ["", data[key].rstrip()]
    return "\n".join(lines) + "\n"


def plot(data: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for key in sorted(data["runs"], key=int):
        r = data["runs"][key]
        for mode, style in (("similarity", "--"), ("decayed", "-"), ("recentred", ":")):
            if mode in r:
                x = [int(e) for e in r[mode]["recall"]]
                ax1.plot(x, list(r[mode]["recall"].values()), style, marker="o", label=f"{int(key):,} {mode}")
                ax2.plot(x, list(r[mode]["p50_ms"].values()), style, marker="o", label=f"{int(key):,} {mode}")
    ax1.set(xlabel="ef_search", ylabel="recall@10", title="recall@10 against the exact objective")
    ax2.set(xlabel="ef_search", ylabel="p50 ms per query", title="search p50")
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def suite_half_lives(name: str, half_lives: list[float], limit: int = 0) -> list[str]:
    """A quality suite's summary line for a pgvector ranking by cosine, then
    by the decayed objective at each half-life: numpy's exact ranking over
    each tenant's memories (the suite's own mapping, dates and questions, the
    quality runs' cached embeddings), top 50, scored by the suite as if it
    were the fused ranking. A BEAM chat or a LongMemEval haystack holds at
    most a few hundred memories, so the pgvector source compares them all
    (exact branch) and ranks them the same way."""
    from benchmarks.common import BEAM_DATA, LONGMEMEVAL_DATA
    from benchmarks.quality.embed_cache import EmbeddingCache, text_key
    from benchmarks.quality.locomo import MappingOptions
    from benchmarks.quality.suites import SUITES

    suite = SUITES[name]({"beam": BEAM_DATA, "longmemeval": LONGMEMEVAL_DATA}[name], limit)
    options = MappingOptions(context_before=2, context_after=1, entities=True)
    cache = EmbeddingCache()
    cfg = load_config()
    model = cfg.embedding.model
    tenants = {}
    for tenant in suite.tenants():
        items, _ = suite.memories(tenant, options, cfg.limits.max_content_chars, suite.max_entities)
        vectors = cache.get([text_key(model, m["content"]) for m in items])
        tenants[tenant] = (
            [m["id"] for m in items],
            np.stack([vectors[text_key(model, m["content"])] for m in items]).astype(np.float64),
            [datetime.fromisoformat(m["created_at"].replace("Z", "+00:00")) for m in items],
        )
    queries = suite.queries()
    query_vectors = cache.get([text_key(model, q.text) for q in queries])
    cache.close()
    lines = []
    for half_life in [0.0, *half_lives]:
        rankings = []
        for q in queries:
            ids, x, created = tenants[q.tenant]
            s = x @ query_vectors[text_key(model, q.text)].astype(np.float64)
            if half_life:
                age = np.array([(q.at - t).total_seconds() for t in created])
                s = s * np.exp(-decay_rate(half_life) * age)  # w is 0.5 for every memory: no effect on the order
            rankings.append([ids[i] for i in sorted(range(len(ids)), key=lambda i: (-s[i], ids[i]))[:50]])
        label = f"decayed, halfLifeDays {half_life:g}" if half_life else "similarity"
        # The suite's summary line, fed this ranking as the fused one and the pgvector one.
        scored = suite.score(rankings)
        lines.append(f"{label}: {suite.summary_line({'configs': {'fused': scored, 'pgvector': scored}})}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, action="append", help="memories (repeatable); default 100000")
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--half-life", type=float, default=30.0, help="halfLifeDays of the decayed tier")
    p.add_argument("--days", type=float, default=730.0, help="ages uniform over this many days")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--maintenance-work-mem", default="1GB", help="for the index builds (the service's: 1GB)")
    p.add_argument("--recentre", action="store_true", help="also time a re-centring and measure its index")
    p.add_argument(
        "--filtered", type=float, default=0.0, metavar="DAYS", help="also search only memories older than DAYS"
    )
    p.add_argument("--home", default="/tmp/braid-decay-fold", help="where the Postgres data goes")
    p.add_argument("--keep", action="store_true", help="keep the Postgres data directory")
    p.add_argument("--name", default=NAME, help="results file name (benchmarks/results/<name>.*)")
    p.add_argument(
        "--suite-half-lives",
        choices=("beam", "longmemeval"),
        help="only print the suite's figures for pgvector's exact ranking by cosine and at --half-lives",
    )
    p.add_argument("--half-lives", default="30,90,365,3650", metavar="DAYS,...")
    p.add_argument("--limit", type=int, default=0, help="with --suite-half-lives: first N questions or chats")
    args = p.parse_args(argv)
    if args.suite_half_lives:
        for line in suite_half_lives(args.suite_half_lives, [float(d) for d in args.half_lives.split(",")], args.limit):
            print(line)
        return 0
    path = RESULTS / f"{args.name}.json"
    data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"runs": {}}
    for size in args.size or [100_000]:
        result = asyncio.run(run_size(args, size))
        # JSON keys are strings: ef_search grids too.
        data["runs"][str(size)] = json.loads(json.dumps(result))
        md = write_results(args.name, report(data), data)
        plot(data, RESULTS / f"{args.name}.png")
        say(f"wrote {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
