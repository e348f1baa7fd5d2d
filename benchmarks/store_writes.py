"""CPU per single-memory write of the Postgres store, outside the HTTP service.

``python -m benchmarks.store_writes [--writes 1200] [--rounds 3] [--concurrency 4] [--name X]``
starts an embedded Postgres (``pg_stat_statements`` preloaded) in a temporary
directory and writes LoCoMo turns as an agent runtime's single writes reach
the store: one memory a call of :meth:`PostgresStore.write_memories`, with
its speaker, session and date, its spaCy extraction (computed before the
clock starts) and the entities new to the tenant (found with
:meth:`PostgresStore.existing_entities`, given seeded random vectors, as the
engine does with embedded ones), ``--concurrency`` writers at once. The
writes are cut into ``--rounds`` rounds after a warm-up of 100. It reports,
per write, the median over rounds of this process's CPU (the store's Python
and psycopg: what the service spends on the write's statements), of
Postgres' CPU (every backend) and of the statements Postgres ran
(``pg_stat_statements`` calls, BEGIN and COMMIT included), and the
statements that took Postgres longest (lock waits included: with several
writers, a popular entity's count row is waited for). No spaCy, no
embedding, no HTTP: those are measured by ``benchmarks.extract_batch`` and
the load benchmark. Run it on two checkouts to compare them: the code
measured is the one imported.

Report: ``benchmarks/results/store-writes[-<name>].{md,json}``; last line::

    store-writes: writes=<n> client_ms=<x> postgres_ms=<x> statements=<x>
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

from benchmarks.common import LOCOMO_DATA, own_and_postgres_cpu, write_results
from benchmarks.quality.locomo import conversation_memories, load_conversations
from deploy import embedded
from deploy.embedded import EmbeddedPostgres
from indexers.extraction import Extraction
from indexers.postgres import EntityInput, MemoryInput, PostgresStore, normalize_name, open_pool
from indexers.spacy_extractor import extract_doc, load_pipeline

MODEL = "all-MiniLM-L6-v2"
DIM = 384
TENANT = "bench"
WARM_UP = 100


def _turns(count: int) -> list[dict[str, Any]]:
    """The first ``count`` LoCoMo turns as an agent runtime writes them (conversations in order)."""
    out: list[dict[str, Any]] = []
    for conversation in load_conversations(LOCOMO_DATA):
        out += conversation_memories(conversation)
        if len(out) >= count:
            break
    if len(out) < count:
        raise SystemExit(f"store-writes: the LoCoMo data has {len(out)} turns, fewer than {count}")
    return out[:count]


def _unit(rng: np.random.Generator, n: int) -> np.ndarray:
    v = rng.standard_normal((n, DIM))
    out: np.ndarray = (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)
    return out


async def _statements(pool: Any) -> int:
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT coalesce(sum(calls), 0) FROM pg_stat_statements")
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def _write(store: PostgresStore, rng: np.random.Generator, memory: MemoryInput, extraction: Extraction) -> None:
    """One write as the engine makes it: the new entities found, embedded (here: random), then stored."""
    names = {normalize_name(e.name): e for e in extraction.entities}
    existing = await store.existing_entities(TENANT, [e.name for e in names.values()])
    new = [e for n, e in sorted(names.items()) if n not in existing]
    vectors = _unit(rng, len(new))
    entities = [
        EntityInput(name=e.name, type=e.type, embedding=tuple(map(float, v)), model=MODEL)
        for e, v in zip(new, vectors, strict=True)
    ]
    await store.write_memories(TENANT, [memory], entities, [extraction])


async def measure(writes: int, rounds: int, concurrency: int) -> dict[str, Any]:
    turns = _turns(WARM_UP + writes)
    nlp = load_pipeline()
    print(f"store-writes: extracting {len(turns)} turns (not measured)", file=sys.stderr, flush=True)
    extractions = [extract_doc(doc) for doc in nlp.pipe([t["content"] for t in turns], batch_size=64)]
    rng = np.random.default_rng(7)
    vectors = _unit(rng, len(turns))
    memories = [
        MemoryInput(
            id=t["id"],
            content=t["content"],
            kind=t["kind"],
            tier=t["tier"],
            created_at=datetime.fromisoformat(t["created_at"].replace("Z", "+00:00")) + timedelta(seconds=i),
            session_id=t.get("session_id"),
            speaker=t.get("speaker"),
            context=t.get("context"),
            embedding=tuple(map(float, v)),
            model=MODEL,
        )
        for i, (t, v) in enumerate(zip(turns, vectors, strict=True))
    ]
    home = Path(tempfile.mkdtemp(prefix="braid-store-writes-"))
    home.chmod(0o755)
    settings = dict(embedded.POSTGRES_SETTINGS)
    embedded.POSTGRES_SETTINGS["shared_preload_libraries"] = "pg_stat_statements"
    pg = EmbeddedPostgres(home / "postgres")
    rows: list[dict[str, float]] = []
    top: list[dict[str, Any]] = []
    try:
        dsn = pg.start()
        with psycopg.connect(dsn, autocommit=True) as sync_conn:
            sync_conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        pool = await open_pool(dsn, dim=DIM, min_size=concurrency, max_size=concurrency)
        try:
            store = PostgresStore(pool)

            async def run(batch: list[int]) -> None:
                queue = iter(batch)

                async def writer() -> None:
                    for i in queue:
                        await _write(store, rng, memories[i], extractions[i])

                await asyncio.gather(*(writer() for _ in range(concurrency)))

            await run(list(range(WARM_UP)))
            async with pool.connection() as conn:
                await conn.execute("SELECT pg_stat_statements_reset()")
            per_round = writes // rounds
            for r in range(rounds):
                batch = list(range(WARM_UP + r * per_round, WARM_UP + (r + 1) * per_round))
                s0 = await _statements(pool)
                c0, p0 = own_and_postgres_cpu(pg.pid or 0)
                t0 = time.perf_counter()
                await run(batch)
                wall = time.perf_counter() - t0
                c1, p1 = own_and_postgres_cpu(pg.pid or 0)
                s1 = await _statements(pool)
                rows.append(
                    {
                        "client_ms": (c1 - c0) / len(batch) * 1e3,
                        "postgres_ms": (p1 - p0) / len(batch) * 1e3,
                        # The read of the counter itself is one statement.
                        "statements": (s1 - s0 - 1) / len(batch),
                        "writes_per_s": len(batch) / wall,
                    }
                )
                print(f"store-writes: round {r + 1}/{rounds}: {rows[-1]}", file=sys.stderr, flush=True)
            async with pool.connection() as conn:
                cur = await conn.execute(
                    "SELECT total_exec_time, calls, max_exec_time, query FROM pg_stat_statements"
                    " ORDER BY total_exec_time DESC LIMIT 12"
                )
                measured = per_round * rounds
                top = [
                    {"ms": t / measured, "calls": c / measured, "max_ms": m, "query": " ".join(q.split())[:160]}
                    for t, c, m, q in await cur.fetchall()
                ]
        finally:
            await pool.close()
    finally:
        embedded.POSTGRES_SETTINGS.clear()
        embedded.POSTGRES_SETTINGS.update(settings)
        pg.stop(mode="immediate")
        shutil.rmtree(home, ignore_errors=True)
    median = {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]}
    return {
        "writes": writes,
        "rounds": rounds,
        "concurrency": concurrency,
        "median": median,
        "rounds_detail": rows,
        "statements": top,
    }


def markdown(report: dict[str, Any], command: str) -> str:
    m = report["median"]
    return "\n".join(
        [
            "# CPU per single-memory write of the Postgres store (no HTTP service, no spaCy, no embedding)",
            "",
            f"Command: `{command}`  ",
            f"{report['writes']} LoCoMo turns written one a call after {WARM_UP} to warm up, "
            f"{report['concurrency']} writers at once, each with its spaCy extraction and new entities "
            f"(random vectors); median of {report['rounds']} rounds.",
            "",
            "| client (store + psycopg) ms | Postgres ms | statements | writes/s |",
            "|---|---|---|---|",
            f"| {m['client_ms']:.2f} | {m['postgres_ms']:.2f} | {m['statements']:.1f} | {m['writes_per_s']:.0f} |",
            "",
            "Statements by execution time (`pg_stat_statements`, every measured round):",
            "",
            "| ms a write | calls a write | slowest call ms | statement |",
            "|---|---|---|---|",
            *(
                f"| {t['ms']:.3f} | {t['calls']:.2f} | {t['max_ms']:.1f} | `{t['query']}` |"
                for t in report["statements"]
            ),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=1200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--name", default="", help="report name suffix")
    args = parser.parse_args(argv)
    if args.writes < args.rounds or args.rounds < 1 or args.concurrency < 1:
        parser.error("--writes must be at least --rounds, and both --rounds and --concurrency at least 1")
    report = asyncio.run(measure(args.writes, args.rounds, args.concurrency))
    command = "python -m benchmarks.store_writes " + " ".join(sys.argv[1:] if argv is None else argv)
    name = "store-writes" + (f"-{args.name}" if args.name else "")
    write_results(name, markdown(report, command), report)
    m = report["median"]
    print(
        f"store-writes: writes={args.writes} client_ms={m['client_ms']:.2f}"
        f" postgres_ms={m['postgres_ms']:.2f} statements={m['statements']:.1f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
