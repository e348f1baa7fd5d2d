"""Recall bookkeeping: which memories recalls returned, written off the request path.

A recall hands its returned ids to :meth:`Bookkeeper.record`, which only
appends to a bounded in-memory queue and never waits. A background task
(:meth:`Bookkeeper.run`) drains the queue every ``bookkeeping.flushMs`` (or
sooner, once a batch is full) and adds the counts to ``memory_usage`` in one
statement per batch. When the queue is full, or Postgres refuses a batch,
the ids are dropped and counted (``/health`` shows the counts; the first
drop of a streak is logged): bookkeeping may lose counts under overload, a
recall never waits for it.

:meth:`Bookkeeper.counts` reads the counts the usage factor needs, for the
few ids that could reach a recall's top (:meth:`fusion.Ranking.usage_ids`).
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Sequence
from datetime import UTC, datetime

import anyio
import msgspec
import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from .base import failure_reason
from .postgres import Read, TextArray, tenant_reads

__all__ = ["Bookkeeper", "BookkeepingStats"]

log = logging.getLogger("braid.bookkeeping")

#: Longest one batch write may take before it is dropped (counted as failed).
WRITE_TIMEOUT_S = 10.0


class BookkeepingStats(msgspec.Struct):
    #: Returned memories waiting to be written.
    queued: int
    #: Returned memories whose use was written.
    written: int
    #: Dropped because the queue was full.
    dropped: int
    #: Dropped because Postgres refused or did not answer the batch.
    failed: int


class Bookkeeper:
    def __init__(self, pool: AsyncConnectionPool, *, queue_size: int, batch_size: int, flush_ms: int) -> None:
        self._pool = pool
        self.queue_size = queue_size
        self.batch_size = batch_size
        self.flush_s = flush_ms / 1000.0
        # (tenant, ids, when); _queued counts the ids in it.
        self._queue: deque[tuple[str, Sequence[str], datetime]] = deque()
        self._queued = 0
        self._wake = anyio.Event()
        self.written = 0
        self.dropped = 0
        self.failed = 0
        self._dropping = False

    def stats(self) -> BookkeepingStats:
        return BookkeepingStats(queued=self._queued, written=self.written, dropped=self.dropped, failed=self.failed)

    def record(self, tenant: str, ids: Sequence[str]) -> bool:
        """Queue one recall's returned ids; never waits. False (and counted)
        when the queue has no room for them."""
        if not ids:
            return True
        if self._queued + len(ids) > self.queue_size:
            self.dropped += len(ids)
            if not self._dropping:
                self._dropping = True
                log.warning("recall bookkeeping queue full (%d): dropping usage counts", self.queue_size)
            return False
        self._dropping = False
        self._queue.append((tenant, ids, datetime.now(UTC)))
        self._queued += len(ids)
        if self._queued >= self.batch_size:
            self._wake.set()
        return True

    async def run(self) -> None:
        """Write queued use until cancelled (then flush what is left, briefly)."""
        try:
            while True:
                with anyio.move_on_after(self.flush_s):
                    await self._wake.wait()
                self._wake = anyio.Event()
                while self._queue:
                    await self.flush()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(2.0):
                while self._queue:
                    await self.flush()

    async def flush(self) -> int:
        """Write up to one batch of the queue; return the ids taken from it."""
        taken = 0
        counts: Counter[tuple[str, str]] = Counter()
        last: dict[tuple[str, str], datetime] = {}
        while self._queue and taken < self.batch_size:
            tenant, ids, at = self._queue.popleft()
            taken += len(ids)
            for i in ids:
                counts[(tenant, i)] += 1
                last[(tenant, i)] = at
        self._queued -= taken
        if not counts:
            return 0
        keys = list(counts)
        try:
            with anyio.fail_after(WRITE_TIMEOUT_S):
                async with self._pool.connection() as conn:
                    # Memories deleted since their recall are skipped: each
                    # is looked for by one index probe (LIMIT 1 keeps it a
                    # probe; a join may be planned as a hash of every memory).
                    await conn.execute(
                        """
                        INSERT INTO memory_usage (tenant, memory_id, usage_count, last_accessed_at)
                        SELECT k.tenant, k.id, k.n, k.at
                        FROM unnest(%s::text[], %s::text[], %s::bigint[], %s::timestamptz[]) AS k(tenant, id, n, at)
                        CROSS JOIN LATERAL (
                            SELECT 1 FROM memories m WHERE m.tenant = k.tenant AND m.id = k.id LIMIT 1
                        ) m
                        ORDER BY k.tenant, k.id
                        ON CONFLICT (tenant, memory_id) DO UPDATE
                        SET usage_count = memory_usage.usage_count + EXCLUDED.usage_count,
                            last_accessed_at = GREATEST(memory_usage.last_accessed_at, EXCLUDED.last_accessed_at)
                        """,
                        (
                            [t for t, _ in keys],
                            [i for _, i in keys],
                            [counts[k] for k in keys],
                            [last[k] for k in keys],
                        ),
                    )
        except (TimeoutError, PoolTimeout, psycopg.Error) as exc:
            self.failed += taken
            log.warning(
                "recall bookkeeping: a batch of %d uses was not written: %s",
                taken,
                failure_reason(exc, WRITE_TIMEOUT_S),
            )
            return taken
        self.written += taken
        return taken

    async def counts(
        self, tenant: str, ids: Sequence[str], *, pool: AsyncConnectionPool | None = None
    ) -> dict[str, int]:
        """How often each of ``ids`` was returned (absent: never), read under
        the tenant's row-level security, in one round trip; on ``pool`` (a
        replica's) rather than the pool the counts are written on."""
        if not ids:
            return {}
        (rows,) = await tenant_reads(
            pool or self._pool,
            tenant,
            [
                Read(
                    "SELECT memory_id, usage_count FROM memory_usage WHERE tenant = %s AND memory_id = ANY(%s)",
                    (tenant, TextArray(ids)),
                )
            ],
        )
        return {row[0]: int(row[1]) for row in rows}
