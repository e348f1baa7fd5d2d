"""CPU per search of the Postgres sources, outside the HTTP service.

``python -m benchmarks.pg_sources [--size N] [--searches S] [--rounds R] [--concurrency C]
[--small-tenants T] [--own-indexes] [--name X]`` loads the big tenant of the load benchmark's corpus
(``benchmarks/load/corpus.py``: ``N`` memories, its entities with random vectors, its
relations; with ``T``, also the memories of the corpus' ``T`` small tenants) into an
embedded Postgres in a temporary directory, then runs the graph and the
pgvector sources' ``search`` directly, ``C`` searches at a time (default 1), ``S`` searches
per row (after 50 to warm up: psycopg prepares a statement from its fifth
execution), ``R`` rounds alternating the sources. With ``--own-indexes`` the
placement step gives the big tenant's tiers their own HNSW indexes
(:mod:`indexers.own_index`), and the pgvector source is measured beside the
same source walking the shared indexes only. It reports CPU ms per
search of this process (the sources' Python: what the service spends on
them) and of Postgres (every backend), the mean of the rounds. Run it on
two checkouts to compare them: the code measured is the one imported.
Report: ``benchmarks/results/pg-sources[-<name>].{md,json}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shutil
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import RESULTS, own_and_postgres_cpu
from benchmarks.load.corpus import BIG_TENANT, build_corpus
from config import load_config
from deploy.embedded import EmbeddedPostgres
from indexers.base import SearchQuery, Source
from indexers.graph import GraphSource
from indexers.own_index import place_indexes
from indexers.pgvector import PgvectorSource, ensure_indexes
from indexers.postgres import EntityInput, MemoryInput, PostgresStore, RelationInput, open_pool

MODEL = "all-MiniLM-L6-v2"


def _memory_inputs(memories: list[dict[str, Any]], vectors: Any) -> list[MemoryInput]:
    return [
        MemoryInput(
            content=m["content"],
            kind=m["kind"],
            tier=m["tier"],
            created_at=datetime.fromisoformat(m["created_at"].replace("Z", "+00:00")),
            id=m["id"],
            session_id=m.get("session_id"),
            speaker=m.get("speaker"),
            entities=tuple(m["entities"]),
            embedding=tuple(float(x) for x in v),
            model=MODEL,
        )
        for m, v in zip(memories, vectors, strict=True)
    ]


async def _load(store: PostgresStore, size: int, small_tenants: int = 0) -> None:
    corpus = build_corpus(size)  # the same big tenant and queries whatever small_tenants
    big = corpus.big
    rng = np.random.default_rng(1)
    await store.write_graph(
        BIG_TENANT,
        [
            EntityInput(name=e["name"], type=e["type"], embedding=tuple(v), model=MODEL)
            for e, v in zip(big.entities, rng.standard_normal((len(big.entities), 384)), strict=True)
        ],
        [RelationInput(r["source"], r["relation"], r["target"], r["weight"]) for r in big.relations],
    )
    for i in range(0, len(big.memories), 500):
        await store.write_memories(BIG_TENANT, _memory_inputs(big.memories[i : i + 500], big.vectors[i : i + 500]))
    # The small tenants share the tiers' indexes with the big one, as in the
    # load benchmark (their memories only: the searches are the big tenant's).
    for tenant in corpus.tenants[1 : 1 + small_tenants]:
        await store.write_memories(tenant.name, _memory_inputs(tenant.memories, tenant.vectors))


class _SharedIndexes(PgvectorSource):
    """The pgvector source walking the tiers' shared indexes only, as before
    large tenants had their own (it never reads ``pgvector_own_indexes``)."""

    async def _read_own(self) -> None:
        self._own_until = math.inf


async def _no_report(update: dict[str, Any]) -> None:
    pass


async def measure(
    size: int, searches: int, rounds: int, concurrency: int = 1, small_tenants: int = 0, own_indexes: bool = False
) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="braid-pgsrc-"))
    home.chmod(0o755)
    pg = EmbeddedPostgres(home / "postgres")
    try:
        dsn = pg.start()
        cfg = load_config()
        pool = await open_pool(dsn, dim=384, min_size=max(2, concurrency), max_size=max(2, concurrency))
        try:
            await _load(PostgresStore(pool), size, small_tenants)
            await ensure_indexes(pool, cfg)
            if own_indexes:
                await place_indexes(pool, cfg, _no_report)
            async with pool.connection() as conn:
                await conn.execute("VACUUM ANALYZE")
            corpus = build_corpus(size)
            queries = [
                SearchQuery(
                    tenant=BIG_TENANT,
                    text=q["text"],
                    vector=tuple(float(x) for x in v),
                    limit=50,
                    min_confidence=cfg.min_confidence,
                    model=MODEL,
                )
                for q, v in zip(corpus.queries, corpus.query_vectors, strict=True)
            ]
            sources: dict[str, Source] = {
                "graph": GraphSource(pool, lambda: cfg),
                "pgvector": PgvectorSource(pool, lambda: cfg),
            }
            if own_indexes:
                sources["pgvector (shared indexes)"] = _SharedIndexes(pool, lambda: cfg)
            for source in sources.values():
                for q in queries[:50]:
                    await source.search(q)
            rows: dict[str, list[dict[str, float]]] = {name: [] for name in sources}
            for r in range(rounds):
                for name, source in sources.items():
                    work = [queries[(r * searches + i) % len(queries)] for i in range(searches)]
                    found: list[int] = []
                    queue = iter(work)

                    async def searcher(source: Source = source) -> None:
                        for q in queue:
                            found.append(len(await source.search(q)))

                    c0, p0 = own_and_postgres_cpu(pg.pid or 0)
                    start = time.perf_counter()
                    await asyncio.gather(*(searcher() for _ in range(concurrency)))
                    hits = sum(found)
                    wall = time.perf_counter() - start
                    c1, p1 = own_and_postgres_cpu(pg.pid or 0)
                    rows[name].append(
                        {
                            "service_ms": (c1 - c0) / searches * 1e3,
                            "postgres_ms": (p1 - p0) / searches * 1e3,
                            "wall_ms": wall / searches * 1e3,
                            "hits": hits / searches,
                        }
                    )
        finally:
            await pool.close()
    finally:
        pg.stop(mode="immediate")
        shutil.rmtree(home, ignore_errors=True)
    mean = {name: {k: float(np.mean([r[k] for r in rs])) for k in rs[0]} for name, rs in rows.items()}
    return {
        "size": size,
        "small_tenants": small_tenants,
        "own_indexes": own_indexes,
        "searches": searches,
        "rounds": rounds,
        "concurrency": concurrency,
        "rounds_detail": rows,
        "mean": mean,
    }


def markdown(report: dict[str, Any], command: str) -> str:
    lines = [
        "# CPU per search of the Postgres sources (no HTTP service)",
        "",
        f"Command: `{command}`  ",
        f"Big tenant of the load corpus, {report['size']} memories{_beside(report.get('small_tenants', 0))}; "
        f"{_at_once(report.get('concurrency', 1))}, limit 50, "
        f"{report['searches']} searches a row, mean of {report['rounds']} alternating rounds."
        + (
            " The placement step gave the big tenant's tiers their own HNSW indexes"
            " (`postgres.ownIndexAbove`); `pgvector (shared indexes)` is the same source not told of them."
            if report.get("own_indexes")
            else ""
        ),
        "",
        "| source | service (Python) ms | Postgres ms | wall ms | hits |",
        "|---|---|---|---|---|",
    ]
    for name, m in report["mean"].items():
        lines.append(
            f"| {name} | {m['service_ms']:.2f} | {m['postgres_ms']:.2f} | {m['wall_ms']:.2f} | {m['hits']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def _beside(small_tenants: int) -> str:
    if not small_tenants:
        return " (no other tenant)"
    return f", beside {small_tenants} tenants x 200 in the same tables and indexes (the load benchmark's shape)"


def _at_once(concurrency: int) -> str:
    return "one search at a time" if concurrency == 1 else f"{concurrency} searches at a time (one connection each)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--searches", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=1, help="searches in flight at once")
    parser.add_argument(
        "--small-tenants", type=int, default=0, help="the load corpus' small tenants loaded beside the big one"
    )
    parser.add_argument(
        "--own-indexes",
        action="store_true",
        help="run the placement step (own HNSW indexes for tenants past postgres.ownIndexAbove) and measure"
        " the pgvector source with and without them",
    )
    parser.add_argument("--name", default="", help="report name suffix")
    args = parser.parse_args()
    report = asyncio.run(
        measure(args.size, args.searches, args.rounds, args.concurrency, args.small_tenants, args.own_indexes)
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / ("pg-sources" + (f"-{args.name}" if args.name else "") + ".md")
    command = "python -m benchmarks.pg_sources " + " ".join(sys.argv[1:])
    out.write_text(markdown(report, command))
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    print(f"wrote {out}")
    for name, m in report["mean"].items():
        print(f"pg-sources: {name} service_ms={m['service_ms']:.2f} postgres_ms={m['postgres_ms']:.2f}")


if __name__ == "__main__":
    main()
