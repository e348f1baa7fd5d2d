"""What each own index costs every statement on ``memories``: planning time and locks, by index count.

``python -m benchmarks.own_index_count [--tenants T] [--rows R] [--counts 0,10,25,50,100]
[--repeats N] [--name X]`` writes ``T`` tenants of ``R`` session memories
(random 384-d vectors) into an embedded Postgres in a temporary directory,
then, for each count ``n``, gives the first ``n`` tenants an own HNSW index
in the session tier (:func:`indexers.own_index.place_indexes`, with
``ownIndexAbove`` = ``R`` and ``ownIndexesMax`` = ``n``) and measures, the
median of ``N`` runs each:

* the planning time of the pgvector source's walk (``EXPLAIN (SUMMARY)``)
  for a tenant without an own index, and for one with (named in the text);
* the planning time of a one-row ``INSERT`` into ``memories``;
* the locks one transaction holds after planning that walk (``pg_locks``).

These are costs of a statement that is planned (psycopg prepares a statement
from its fifth execution on a connection; a prepared generic plan is not
planned again). Report: ``benchmarks/results/own-index-count[-<name>].{md,json}``.
Last line: ``own-index-count: <n>=<walk planning ms>/<locks> ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import statistics
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import psycopg
from pgvector.psycopg import register_vector_async

from benchmarks.common import RESULTS
from config import load_config
from deploy.embedded import EmbeddedPostgres
from indexers.own_index import own_indexes, place_indexes
from indexers.pgvector import ensure_indexes, merged_walk_sql, set_search_params
from indexers.postgres import HIT_COLUMNS, MemoryInput, PostgresStore, open_pool

MODEL = "synthetic"
WHERE = (
    "m.tenant = {tenant} AND m.model = %(model)s AND m.confidence >= 0.5"
    " AND m.superseded_at IS NULL AND m.tier = 'session'"
)
INSERT = (
    "INSERT INTO memories (tenant, id, content, kind, tier, created_at, embedding, model)"
    " VALUES (%(tenant)s, %(id)s, 'x', 'note', 'session', now(), %(vec)s, %(model)s)"
)


async def _no_report(update: dict[str, Any]) -> None:
    pass


def _planning_ms(plan: list[str]) -> float:
    for line in plan:
        if m := re.match(r"\s*Planning Time: ([\d.]+) ms", line):
            return float(m.group(1))
    raise ValueError("no Planning Time in the plan")


async def _walk_cost(
    conn: psycopg.AsyncConnection[Any], tenant_sql: str, params: dict[str, Any], repeats: int
) -> tuple[float, int]:
    """Median planning ms of the walk, and the locks its transaction holds."""
    # As the pgvector source: a tenant given as a parameter walks the shared index, its own rows beside.
    aside = "m.own" if tenant_sql == "%(tenant)s" else None
    statement = merged_walk_sql(HIT_COLUMNS, "memories m", [(WHERE.format(tenant=tenant_sql), aside)])
    times: list[float] = []
    locks = 0
    for _ in range(repeats):
        async with conn.transaction():
            await set_search_params(conn, 40)
            cur = await conn.execute("EXPLAIN (SUMMARY) " + statement, params)
            times.append(_planning_ms([r[0] for r in await cur.fetchall()]))
            cur = await conn.execute("SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid()")
            row = await cur.fetchone()
            locks = int(row[0]) if row else 0
    return statistics.median(times), locks


async def _insert_planning(conn: psycopg.AsyncConnection[Any], params: dict[str, Any], repeats: int) -> float:
    times: list[float] = []
    for i in range(repeats):
        async with conn.transaction():
            cur = await conn.execute("EXPLAIN (SUMMARY) " + INSERT, {**params, "id": f"probe-{i}"})
            times.append(_planning_ms([r[0] for r in await cur.fetchall()]))
    return statistics.median(times)


async def measure(tenants: int, rows: int, counts: list[int], repeats: int) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="braid-own-count-"))
    home.chmod(0o755)
    pg = EmbeddedPostgres(home / "postgres")
    results: list[dict[str, Any]] = []
    try:
        dsn = pg.start()
        base = load_config()
        pool = await open_pool(dsn, dim=384, min_size=1, max_size=2)
        try:
            store = PostgresStore(pool)
            rng = np.random.default_rng(7)
            names = [f"t{i:04d}" for i in range(tenants)]
            for t in names:
                v = rng.standard_normal((rows, 384)).astype(np.float32)
                v /= np.linalg.norm(v, axis=1, keepdims=True)
                await store.write_memories(
                    t,
                    [
                        MemoryInput(
                            content=f"{t} memory {j}",
                            kind="note",
                            tier="session",
                            created_at=datetime(2026, 1, 1, tzinfo=UTC),
                            id=f"{t}-{j}",
                            embedding=tuple(float(x) for x in v[j]),
                            model=MODEL,
                        )
                        for j in range(rows)
                    ],
                )
            await ensure_indexes(pool, base)
            async with pool.connection() as conn:
                await conn.execute("VACUUM ANALYZE memories")
            q = rng.standard_normal(384).astype(np.float32)
            params = {"vec": q / np.linalg.norm(q), "model": MODEL, "limit": 50}
            tier = msgspec.structs.replace(base.tiers["session"], exact_below=min(rows - 1, 2000))
            for n in sorted(counts):
                # The first n tenants (equal sizes: the tie goes by name) get
                # one each; the counts grow, so an index once built stays.
                if n:
                    postgres = msgspec.structs.replace(base.postgres, own_index_above=rows, own_indexes_max=n)
                    cfg = msgspec.structs.replace(base, tiers={**base.tiers, "session": tier}, postgres=postgres)
                    await place_indexes(pool, cfg, _no_report)
                have = len(await own_indexes(pool))
                async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                    await register_vector_async(conn)
                    shared_ms, shared_locks = await _walk_cost(
                        conn, "%(tenant)s", {**params, "tenant": names[-1]}, repeats
                    )
                    own_ms, own_locks = await _walk_cost(conn, f"'{names[0]}'", params, repeats) if n else (None, None)
                    insert_ms = await _insert_planning(conn, {**params, "tenant": names[-1]}, repeats)
                row = {
                    "own_indexes": have,
                    "walk_planning_ms": shared_ms,
                    "walk_locks": shared_locks,
                    "own_walk_planning_ms": own_ms,
                    "own_walk_locks": own_locks,
                    "insert_planning_ms": insert_ms,
                }
                print(f"own-index-count: {row}", flush=True)
                results.append(row)
        finally:
            await pool.close()
    finally:
        pg.stop(mode="immediate")
        shutil.rmtree(home, ignore_errors=True)
    return {"tenants": tenants, "rows": rows, "repeats": repeats, "rows_by_count": results}


def markdown(report: dict[str, Any], command: str) -> str:
    lines = [
        "# What own indexes cost every statement on `memories`: planning and locks, by index count",
        "",
        f"Command: `{command}`  ",
        f"{report['tenants']} tenants of {report['rows']} session memories in an embedded Postgres; the first n "
        f"get an own index. Median of {report['repeats']} runs. A walk of a tenant without an own index "
        "(its tenant a parameter) and of one with (named in the text); a one-row INSERT.",
        "",
        "| own indexes | walk planning ms | locks held | own tenant's walk planning ms | locks held | INSERT planning ms |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["rows_by_count"]:
        own = "–" if r["own_walk_planning_ms"] is None else f"{r['own_walk_planning_ms']:.3f}"
        own_locks = "–" if r["own_walk_locks"] is None else str(r["own_walk_locks"])
        lines.append(
            f"| {r['own_indexes']} | {r['walk_planning_ms']:.3f} | {r['walk_locks']} | {own} | {own_locks} "
            f"| {r['insert_planning_ms']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--rows", type=int, default=300)
    parser.add_argument("--counts", default="0,10,25,50,100")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--name", default="", help="report name suffix")
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    if max(counts) > args.tenants:
        raise SystemExit(f"--counts go up to {max(counts)}, more than --tenants {args.tenants}")
    report = asyncio.run(measure(args.tenants, args.rows, counts, args.repeats))
    command = "python -m benchmarks.own_index_count " + " ".join(sys.argv[1:])
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / ("own-index-count" + (f"-{args.name}" if args.name else "") + ".md")
    out.write_text(markdown(report, command))
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    print(
        "own-index-count: "
        + " ".join(f"{r['own_indexes']}={r['walk_planning_ms']:.3f}/{r['walk_locks']}" for r in report["rows_by_count"])
    )


if __name__ == "__main__":
    main()
