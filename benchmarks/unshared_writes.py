"""CPU of a small tenant's memory writes, with its rows in the tiers' shared HNSW indexes and without.

``python -m benchmarks.unshared_writes [--shared 20000,100000] [--tenants 40] [--per 100] [--name X]``

Starts an embedded Postgres in a temporary directory with the shipped
config's memory tiers (m 24 / efConstruction 128). For each ``--shared``
size, the tiers' shared indexes are made to hold that many rows of one large
tenant (vectors around 200 Gaussian centres, noise norm ~1.0, as the load
corpus; ~70% tier ``session``, ~30% ``rag``; copied in, then indexed).
Then ``--tenants`` new small tenants write ``--per`` memories each, one
:meth:`PostgresStore.write_memories` a tenant, alternating two ways:

- ``unshared`` (as the engine writes, given each tier's ``exactBelow``):
  a tenant holding at most ``exactBelow`` rows in a tier has them flagged,
  out of the shared index (:mod:`indexers.postgres.unshared`);
- ``shared`` (no ``exactBelow`` given: every write before): each row is
  inserted into its tier's shared index.

Both ways a small tenant's searches compare its rows exactly; the report
checks that each tenant's nearest row to one of its own vectors is that row.
Each tenant then writes as many entities (one :meth:`PostgresStore.write_graph`,
the memories' vectors), the entity index holding as many entities of the
large tenant, flagged ``small`` or not the same way. Reported per way and
size: Postgres CPU ms a memory (every backend), this process' (the store's
Python and psycopg), memories/s, Postgres CPU ms an entity. The code
measured is the one imported.

Report: ``benchmarks/results/unshared-writes[-<name>].{md,json}``; last line::

    unshared-writes: <size>:shared_ms=<x>,unshared_ms=<x>,ratio=<shared / unshared>,entity_shared_ms=<x>,entity_unshared_ms=<x> ...
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg import register_vector_async

from benchmarks.common import own_and_postgres_cpu, write_results
from config import load_config
from deploy.embedded import EmbeddedPostgres
from indexers.base import Filters, SearchQuery
from indexers.pgvector import PgvectorSource, ensure_indexes, index_name
from indexers.postgres import EntityInput, MemoryInput, PostgresStore, open_pool

DIM = 384
MODEL = "synthetic"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def clustered_vectors(rng: np.random.Generator, centres: np.ndarray, n: int) -> np.ndarray:
    """``n`` unit vectors around ``centres`` (noise norm ~1.0), as the load corpus'."""
    v = centres[rng.integers(0, len(centres), n)] + rng.standard_normal((n, DIM)) / np.sqrt(DIM)
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def _tier(i: int) -> str:
    return "session" if i % 10 < 7 else "rag"


async def _fill(dsn: str, rng: np.random.Generator, centres: np.ndarray, start: int, stop: int) -> None:
    """Rows ``start..stop`` of the large tenant, memories and entities,
    copied in (no index to insert into yet)."""
    vectors = clustered_vectors(rng, centres, stop - start)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await register_vector_async(conn)
        async with conn.cursor() as cur:
            columns = "tenant, id, content, kind, tier, embedding, model, created_at"
            async with cur.copy(f"COPY memories ({columns}) FROM STDIN") as copy:
                for k, i in enumerate(range(start, stop)):
                    await copy.write_row(("big", f"big-{i}", f"memory {i}", "note", _tier(i), vectors[k], MODEL, T0))
            async with cur.copy("COPY entities (tenant, name, name_norm, embedding, model) FROM STDIN") as copy:
                for k, i in enumerate(range(start, stop)):
                    await copy.write_row(("big", f"Entity {i}", f"entity {i}", vectors[k], MODEL))


async def measure(sizes: list[int], tenants: int, per: int, seed: int = 11) -> dict[str, Any]:
    cfg = load_config()
    limits = {tier: cfg.tiers[tier].exact_below for tier in cfg.memory_tiers}
    entity_limit = cfg.tiers[cfg.entity_tier].exact_below
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((200, DIM))
    home = Path(tempfile.mkdtemp(prefix="braid-unshared-"))
    home.chmod(0o755)
    pg = EmbeddedPostgres(home / "postgres")
    stages: list[dict[str, Any]] = []
    try:
        dsn = pg.start()
        pool = await open_pool(dsn, dim=DIM, min_size=1, max_size=2)
        try:
            store = PostgresStore(pool)
            source = PgvectorSource(pool, lambda: cfg)
            have = 0
            for size in sizes:
                print(f"unshared-writes: {size} rows in the shared indexes", flush=True)
                async with pool.connection() as conn:
                    for tier in [*cfg.memory_tiers, cfg.entity_tier]:
                        await conn.execute(f"DROP INDEX IF EXISTS {index_name(tier, cfg)}")
                await _fill(dsn, rng, centres, have, size)
                have = size
                t0 = time.perf_counter()
                await ensure_indexes(pool, cfg)
                built_s = time.perf_counter() - t0
                async with pool.connection() as conn:
                    await conn.execute("ANALYZE memories")
                    await conn.execute("ANALYZE entities")
                used = {"shared": [0.0, 0.0, 0.0], "unshared": [0.0, 0.0, 0.0]}
                entity_ms = {"shared": 0.0, "unshared": 0.0}
                found = {"shared": 0, "unshared": 0}
                for t in range(tenants):
                    way = "unshared" if t % 2 == 0 else "shared"
                    name = f"s{size}-t{t}"
                    vectors = clustered_vectors(rng, centres, per)
                    batch = [
                        MemoryInput(
                            content=f"memory {i} of {name}",
                            kind="note",
                            tier=_tier(i),
                            created_at=T0,
                            embedding=tuple(map(float, v)),
                            model=MODEL,
                            id=f"{name}-{i}",
                        )
                        for i, v in enumerate(vectors)
                    ]
                    c0, p0 = own_and_postgres_cpu(pg.pid or 0)
                    w0 = time.perf_counter()
                    await store.write_memories(name, batch, exact_below=limits if way == "unshared" else None)
                    wall = time.perf_counter() - w0
                    c1, p1 = own_and_postgres_cpu(pg.pid or 0)
                    used[way][0] += (p1 - p0) * 1e3
                    used[way][1] += (c1 - c0) * 1e3
                    used[way][2] += wall
                    q = SearchQuery(
                        tenant=name,
                        text="",
                        vector=batch[0].embedding,
                        limit=1,
                        model=MODEL,
                        filters=Filters(tiers=("session",)),
                    )
                    hits = await source.search(q)
                    found[way] += bool(hits) and hits[0].id == f"{name}-0"
                    # The tenant's entities, one graph write (no relations).
                    entities = [
                        EntityInput(name=f"{name} entity {i}", embedding=m.embedding, model=MODEL)
                        for i, m in enumerate(batch)
                    ]
                    e0 = own_and_postgres_cpu(pg.pid or 0)[1]
                    limit = entity_limit if way == "unshared" else None
                    await store.write_graph(name, entities, [], entity_exact_below=limit)
                    entity_ms[way] += (own_and_postgres_cpu(pg.pid or 0)[1] - e0) * 1e3
                n = tenants // 2 * per
                ways = {
                    way: {
                        "postgres_ms": used[way][0] / n,
                        "client_ms": used[way][1] / n,
                        "per_s": n / used[way][2],
                        "found": found[way],
                        "entity_postgres_ms": entity_ms[way] / n,
                    }
                    for way in used
                }
                stages.append({"shared_rows": size, "built_s": built_s, "memories": n, "ways": ways})
                s, u = ways["shared"], ways["unshared"]
                print(
                    f"unshared-writes: {size}: Postgres ms a memory shared {s['postgres_ms']:.2f},"
                    f" unshared {u['postgres_ms']:.2f}",
                    flush=True,
                )
        finally:
            await pool.close()
    finally:
        pg.stop()
        shutil.rmtree(home, ignore_errors=True)
    return {"tenants": tenants, "per": per, "limits": limits, "stages": stages}


def markdown(report: dict[str, Any], command: str) -> str:
    limits = ", ".join(f"{k} {v}" for k, v in report["limits"].items())
    lines = [
        "# A small tenant's memory writes: into the shared HNSW indexes, or flagged out of them",
        "",
        f"Command: `{command}`  ",
        f"Embedded Postgres, the shipped memory tiers (exactBelow: {limits}). At each size, the shared indexes hold"
        " that many rows of one large tenant; then"
        f" {report['tenants']} new tenants write {report['per']} memories each (one write a tenant), alternately"
        " `unshared` (flagged while the tenant holds at most exactBelow rows in the tier, as the engine writes)"
        " and `shared` (every row inserted into its tier's shared index, as before). CPU ms a memory: Postgres"
        " (every backend) and the client (the store's Python and psycopg). `found`: tenants whose own first vector's"
        " nearest row (tier session, limit 1) was that memory. Entities: the entity index holds as many entities"
        " of the large tenant; each tenant then writes as many entities as memories (one graph write, the"
        " memories' vectors), flagged while it holds at most the entity tier's exactBelow or not, the same way.",
        "",
        "| shared rows | index build s | way | memories | Postgres CPU ms a memory | client CPU ms a memory"
        " | memories/s | found | Postgres CPU ms an entity |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in report["stages"]:
        for way in ("shared", "unshared"):
            w = s["ways"][way]
            lines.append(
                f"| {s['shared_rows']} | {s['built_s']:.0f} | {way} | {s['memories']} | {w['postgres_ms']:.3f}"
                f" | {w['client_ms']:.3f} | {w['per_s']:.0f} | {w['found']} of {report['tenants'] // 2}"
                f" | {w['entity_postgres_ms']:.3f} |"
            )
    return "\n".join(lines) + "\n"


def summary(report: dict[str, Any]) -> str:
    parts = []
    for s in report["stages"]:
        sh, un = s["ways"]["shared"]["postgres_ms"], s["ways"]["unshared"]["postgres_ms"]
        esh, eun = s["ways"]["shared"]["entity_postgres_ms"], s["ways"]["unshared"]["entity_postgres_ms"]
        parts.append(
            f"{s['shared_rows']}:shared_ms={sh:.2f},unshared_ms={un:.3f},ratio={sh / max(un, 1e-9):.0f}"
            f",entity_shared_ms={esh:.2f},entity_unshared_ms={eun:.3f}"
        )
    return "unshared-writes: " + " ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", default="20000,100000", help="rows in the shared indexes, ascending")
    parser.add_argument("--tenants", type=int, default=40)
    parser.add_argument("--per", type=int, default=100)
    parser.add_argument("--name", default="", help="report name suffix")
    args = parser.parse_args(argv)
    sizes = [int(x) for x in args.shared.split(",") if x.strip()]
    if not sizes or sizes != sorted(sizes) or sizes[0] < 1:
        parser.error("--shared takes positive sizes in ascending order")
    if args.tenants < 2 or args.per < 1:
        parser.error("--tenants must be at least 2 and --per at least 1")
    report = asyncio.run(measure(sizes, args.tenants, args.per))
    command = "python -m benchmarks.unshared_writes " + " ".join(sys.argv[1:] if argv is None else argv)
    name = "unshared-writes" + (f"-{args.name}" if args.name else "")
    write_results(name, markdown(report, command), report)
    print(summary(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
