"""Postgres CPU of the graph's vector seeds, with small tenants' entities read beside the walk and without.

``python -m benchmarks.graph_seeds [--big 2568] [--small 500] [--others 50000] [--queries 400] [--rounds 8] [--name X]``

Starts an embedded Postgres in a temporary directory and copies in entities
(384-d vectors around 200 Gaussian centres, noise norm ~1.0, as the load
corpus): a large tenant ``big`` of ``--big`` entities and others of 5,000
each up to ``--others`` entities, none of them flagged ``small``, and
``--small`` tenants of 40 entities flagged ``small`` (as a tenant under the
entity tier's ``exactBelow`` writes them, :mod:`indexers.postgres.unshared`);
then builds the entity index (``WHERE NOT small``, the shipped config's
entity tier). The graph source's seed statement (:func:`indexers.graph._seeds_cte`,
its vector part, under :func:`indexers.pgvector.search_settings`) is run two ways:

- ``aside``: as shipped: the walk reads the entities the index holds, the
  flagged ones are compared exactly beside it, the nearest ``seedLimit`` kept;
- ``walk only``: as before the entity index left small tenants out (no
  aside; the statement as it was at e6ff901).

For ``big`` (past ``exactBelow``: the index is walked) and for one small
tenant (compared exactly), ``--rounds`` rounds of ``--queries`` queries
(vectors near the corpus'), the ways alternating round by round, each query
a transaction on one connection with the statement prepared. Reported per
way and tenant: Postgres CPU ms a statement (every backend), wall ms, the
queries whose seeds are the same both ways, and of the others those that
differ only in which of equally near entities was kept at the cut. The code measured is the
one imported.

The graph source runs this statement only for a walk it does not make in
the service (``graph.cacheRows``: a tenant whose graph is not held, or a
recall ``as_of``).

Report: ``benchmarks/results/graph-seeds[-<name>].{md,json}``; last line::

    graph-seeds: big:aside_ms=<x>,walk_ms=<x> small:aside_ms=<x>,walk_ms=<x> same=<n>/<n> tied=<n>
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg import register_vector_async

from benchmarks.common import own_and_postgres_cpu, write_results
from benchmarks.unshared_writes import DIM, clustered_vectors
from config import load_config
from deploy.embedded import EmbeddedPostgres
from indexers.graph import _seeds_cte
from indexers.pgvector import ensure_indexes, nearest_sql, search_settings
from indexers.postgres import open_pool

MODEL = "synthetic"
SMALL_SIZE = 40
OTHER_SIZE = 5000
WAYS = ("aside", "walk only")


def _walk_only_seeds() -> str:
    """:func:`indexers.graph._seeds_cte` (seeded) as it was at e6ff901, before
    the entity index left flagged entities out: no aside, no cut after it."""
    nearest = nearest_sql("e.id", "entities e", "e.tenant = %(tenant)s AND e.model = %(model)s", "e.embedding")
    return f"""seeds AS MATERIALIZED (
            SELECT id, max(weight) AS weight FROM (
                SELECT e.id, 1.0::float8 AS weight FROM entities e
                WHERE e.tenant = %(tenant)s AND e.name_norm = ANY(%(names)s::text[])
            UNION ALL
            SELECT n.id, 1.0 - n.distance FROM ({nearest}) n
            WHERE 1.0 - n.distance >= %(min_similarity)s
            ) s
            GROUP BY id
        )"""


def statements() -> dict[str, str]:
    """Each way's statement: the seeds' ids and weights."""
    return {
        "aside": f"WITH {_seeds_cte(True)} SELECT id, weight FROM seeds ORDER BY id",
        "walk only": f"WITH {_walk_only_seeds()} SELECT id, weight FROM seeds ORDER BY id",
    }


async def _fill(dsn: str, rng: np.random.Generator, centres: np.ndarray, big: int, small: int, others: int) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await register_vector_async(conn)
        async with conn.cursor() as cur:
            async with cur.copy("COPY entities (tenant, name, name_norm, embedding, model, small) FROM STDIN") as copy:
                rows = [("big", v, False) for v in clustered_vectors(rng, centres, big)]
                rows += [
                    (f"s{k // SMALL_SIZE}", v, True)
                    for k, v in enumerate(clustered_vectors(rng, centres, small * SMALL_SIZE))
                ]
                rows += [
                    (f"o{k // OTHER_SIZE}", v, False) for k, v in enumerate(clustered_vectors(rng, centres, others))
                ]
                for k, (tenant, v, flagged) in enumerate(rows):
                    await copy.write_row((tenant, f"Entity {k}", f"entity {k}", v, MODEL, flagged))


async def measure(big: int, small: int, others: int, queries: int, rounds: int, seed: int = 5) -> dict[str, Any]:
    cfg = load_config()
    tier = cfg.tiers[cfg.entity_tier]
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((200, DIM))
    home = Path(tempfile.mkdtemp(prefix="braid-graph-seeds-"))
    home.chmod(0o755)
    pg = EmbeddedPostgres(home / "postgres")
    try:
        dsn = pg.start()
        pool = await open_pool(dsn, dim=DIM, min_size=1, max_size=2)
        try:
            await _fill(dsn, rng, centres, big, small, others)
            await ensure_indexes(pool, cfg)
        finally:
            await pool.close()
        sql = statements()
        settings_sql = "SELECT " + ", ".join(f"set_config('{k}', %s, true)" for k in search_settings(0))
        settings = list(search_settings(tier.ef_search).values())
        qs = clustered_vectors(rng, centres, queries)
        tenants = {"big": "big", "small": "s0"}
        out: dict[str, Any] = {}
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await register_vector_async(conn)
            await conn.execute("ANALYZE entities")
            await conn.commit()

            async def run(way: str, tenant: str, q: np.ndarray) -> list[tuple[int, float]]:
                params = {
                    "tenant": tenant,
                    "names": [],
                    "model": MODEL,
                    "vec": q,
                    "limit": cfg.graph.seed_limit,
                    "exact_below": tier.exact_below,
                    "min_similarity": cfg.graph.seed_min_similarity,
                }
                await conn.execute(settings_sql, settings)
                cur = await conn.execute(sql[way], params, prepare=True)
                rows = await cur.fetchall()
                await conn.commit()
                return [(int(r[0]), round(float(r[1]), 6)) for r in rows]

            for label, tenant in tenants.items():
                same = tied = 0
                for q in qs:
                    aside, walk = await run("aside", tenant, q), await run("walk only", tenant, q)
                    same += aside == walk
                    # Seeds of equal weight at the cut: either may be kept.
                    tied += aside != walk and sorted(w for _, w in aside) == sorted(w for _, w in walk)
                used = {way: [0.0, 0.0, 0] for way in WAYS}
                for r in range(rounds):
                    for way in WAYS if r % 2 == 0 else WAYS[::-1]:
                        p0 = own_and_postgres_cpu(pg.pid or 0)[1]
                        w0 = time.perf_counter()
                        for q in qs:
                            await run(way, tenant, q)
                        used[way][1] += time.perf_counter() - w0
                        used[way][0] += own_and_postgres_cpu(pg.pid or 0)[1] - p0
                        used[way][2] += len(qs)
                out[label] = {
                    "tenant": tenant,
                    "entities": big if label == "big" else SMALL_SIZE,
                    "same": same,
                    "tied": tied,
                    "queries": len(qs),
                    "ways": {
                        way: {"postgres_ms": cpu * 1e3 / n, "wall_ms": wall * 1e3 / n, "statements": n}
                        for way, (cpu, wall, n) in used.items()
                    },
                }
                print(
                    f"graph-seeds: {label}: Postgres ms a statement, aside"
                    f" {out[label]['ways']['aside']['postgres_ms']:.3f},"
                    f" walk only {out[label]['ways']['walk only']['postgres_ms']:.3f}",
                    flush=True,
                )
    finally:
        pg.stop()
        shutil.rmtree(home, ignore_errors=True)
    return {
        "big": big,
        "small": small,
        "others": others,
        "exact_below": tier.exact_below,
        "seed_limit": cfg.graph.seed_limit,
        "tenants": out,
    }


def markdown(report: dict[str, Any], command: str) -> str:
    lines = [
        "# The graph's vector seeds: small tenants' entities read beside the walk, or no aside",
        "",
        f"Command: `{command}`  ",
        f"Embedded Postgres; entities: tenant `big` with {report['big']} (none flagged), {report['others']} of"
        f" other tenants (5,000 each, none flagged) and {report['small']} small tenants of 40 flagged `small`;"
        f" the entity index (`WHERE NOT small`) built after the copy. The entity tier's exactBelow is"
        f" {report['exact_below']}, seedLimit {report['seed_limit']}. Each way ran the same queries in alternating"
        " rounds, one transaction a query (the search settings, then the prepared statement). `aside`: as"
        " shipped; `walk only`: the statement before the entity index left flagged entities out. Postgres CPU is"
        " every backend's; `same`: queries whose seeds (ids and weights) were equal both ways; `tied`: of the"
        " others, those whose seeds' weights were equal (they differ in which of equally near entities was kept).",
        "",
        "| tenant | entities | way | statements | Postgres CPU ms a statement | wall ms a statement | same | tied |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, t in report["tenants"].items():
        for way in WAYS:
            w = t["ways"][way]
            lines.append(
                f"| {label} | {t['entities']} | {way} | {w['statements']} | {w['postgres_ms']:.3f}"
                f" | {w['wall_ms']:.3f} | {t['same']} of {t['queries']} | {t['tied']} |"
            )
    return "\n".join(lines) + "\n"


def summary(report: dict[str, Any]) -> str:
    parts = []
    same = tied = queries = 0
    for label, t in report["tenants"].items():
        parts.append(
            f"{label}:aside_ms={t['ways']['aside']['postgres_ms']:.3f},walk_ms={t['ways']['walk only']['postgres_ms']:.3f}"
        )
        same += t["same"]
        tied += t["tied"]
        queries += t["queries"]
    return "graph-seeds: " + " ".join(parts) + f" same={same}/{queries} tied={tied}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--big", type=int, default=2568, help="entities of the large tenant (default: the load corpus')"
    )
    parser.add_argument("--small", type=int, default=500, help="small tenants of 40 flagged entities")
    parser.add_argument("--others", type=int, default=50000, help="entities of other large tenants, in the index")
    parser.add_argument("--queries", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=8, help="rounds, the ways alternating (even)")
    parser.add_argument("--name", default="", help="report name suffix")
    args = parser.parse_args(argv)
    if args.big < 1 or args.small < 1 or args.others < 0 or args.queries < 1:
        parser.error("--big, --small and --queries must be at least 1, --others at least 0")
    if args.rounds < 2 or args.rounds % 2:
        parser.error("--rounds must be even and at least 2")
    report = asyncio.run(measure(args.big, args.small, args.others, args.queries, args.rounds))
    command = "python -m benchmarks.graph_seeds " + " ".join(sys.argv[1:] if argv is None else argv)
    name = "graph-seeds" + (f"-{args.name}" if args.name else "")
    write_results(name, markdown(report, command), report)
    print(summary(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
