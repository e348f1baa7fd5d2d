"""What a recall's read of unindexed memories costs: ``python -m benchmarks.unindexed_cost``.

A recall that asks Typesense also reads, while its query is embedded, the
tenant's memories whose outbox rows are still pending
(``PostgresStore.unindexed``), so that Typesense can rank a memory written a
moment ago as it will once the outbox has applied it. This times that read
on an embedded Postgres holding one tenant of 10,000 memories: with nothing
pending, with 2,000 pending rows of another tenant, and with 50 of the
tenant's own pending, with and without their embeddings (read only when
Typesense searches by vector itself). Writes ``benchmarks/results/unindexed-cost.md``.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from benchmarks.common import write_results
from deploy.embedded import EmbeddedPostgres
from indexers.base import Filters
from indexers.postgres import MemoryInput, PostgresStore, open_pool

DIM = 384
SIZE = 10_000
TIERS = ("session", "rag")
ROUNDS = 200


async def measure(pg: EmbeddedPostgres) -> list[tuple[str, float, float]]:
    pool = await open_pool(pg.dsn(), dim=DIM, min_size=1, max_size=4)
    store = PostgresStore(pool)
    rng = np.random.default_rng(1)

    def memory(i: int) -> MemoryInput:
        v = rng.standard_normal(DIM).astype(np.float32)
        v /= np.linalg.norm(v)
        when = datetime(2025, 1, 1, tzinfo=UTC)
        return MemoryInput(
            content=f"memory {i}",
            id=f"m{i}",
            kind="note",
            tier="session",
            created_at=when,
            embedding=tuple(map(float, v)),
            model="m",
        )

    for start in range(0, SIZE, 500):
        await store.write_memories("big", [memory(i) for i in range(start, start + 500)])
    async with pool.connection() as conn:
        await conn.execute("UPDATE outbox SET processed_at = now()")
        await conn.execute("VACUUM ANALYZE outbox")
    rows: list[tuple[str, float, float]] = []

    async def timed(label: str, embeddings: bool = True) -> None:
        async def once() -> None:
            await store.unindexed(
                "big", Filters(), min_confidence=0.0, memory_tiers=TIERS, limit=256, embeddings=embeddings
            )

        for _ in range(20):
            await once()
        times = []
        for _ in range(ROUNDS):
            start = time.perf_counter()
            await once()
            times.append((time.perf_counter() - start) * 1000)
        rows.append((label, statistics.median(times), float(np.percentile(times, 95))))
        print(f"{label}: p50 {rows[-1][1]:.2f} ms, p95 {rows[-1][2]:.2f} ms", file=sys.stderr, flush=True)

    await timed("nothing pending")
    await store.write_memories("other", [memory(20_000 + i) for i in range(2000)])
    await timed("2,000 rows of another tenant pending")
    await store.write_memories("big", [memory(30_000 + i) for i in range(50)])
    await timed("50 of the tenant's memories pending, with embeddings")
    await timed("50 of the tenant's memories pending, without embeddings", embeddings=False)
    await pool.close()
    return rows


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="braid-unindexed-"))
    home.chmod(0o755)
    pg = EmbeddedPostgres(home / "postgres")
    pg.start()
    try:
        rows = asyncio.run(measure(pg))
    finally:
        pg.stop(mode="immediate")
        shutil.rmtree(home, ignore_errors=True)
    lines = [
        "# The recall's read of unindexed memories (`python -m benchmarks.unindexed_cost`)",
        "",
        f"One tenant of {SIZE:,} memories on an embedded Postgres, `PostgresStore.unindexed` (limit 256) "
        f"timed {ROUNDS} times after 20 warm-up reads, one at a time, on the shared 2-core machine. "
        "The read runs while the recall's query is embedded.",
        "",
        "| pending | p50 ms | p95 ms |",
        "|---|---|---|",
        *(f"| {label} | {p50:.2f} | {p95:.2f} |" for label, p50, p95 in rows),
        "",
    ]
    print(f"wrote {write_results('unindexed-cost', chr(10).join(lines))}", file=sys.stderr)


if __name__ == "__main__":
    main()
