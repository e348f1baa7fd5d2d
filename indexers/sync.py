"""The outbox worker: keeps Typesense in step with Postgres.

Every write leaves outbox rows in the same transaction as the memory. The
worker claims pending rows (``FOR UPDATE SKIP LOCKED``, so several service
processes can run it; a memory's rows by one worker at a time, see
:data:`_CLAIM`), reads the memories' *current* rows, upserts them into
Typesense (or deletes the ones that are gone), and marks the rows processed
in the same transaction. If Typesense is unreachable the transaction rolls
back, the rows stay pending, and the worker retries with backoff: a write
made during an outage is applied when Typesense returns.

It wakes on ``NOTIFY braid_outbox`` (sent at commit), so a write is normally
searchable in Typesense a few milliseconds after it is acknowledged.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Protocol

import anyio
import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from .base import BackendError, MemoryRecord, SourceUnavailable
from .migrations import TERM_KEY_REWRITE
from .postgres import NOTIFY_CHANNEL, RECORD_COLUMNS, PostgresStore, record_from_row

__all__ = ["OutboxSync", "TermKeyRewrite", "TypesenseWriter"]

log = logging.getLogger("braid.sync")

#: Processed outbox rows are kept this long: reindex replays them.
RETENTION = "1 hour"

#: How long a shutdown waits for the batch in hand (:meth:`OutboxSync.stop`).
STOP_S = 5.0

#: A batch of pending outbox rows claimed, each with its memory's current row
#: (the memory columns all NULL for a memory that is gone), in one statement.
#:
#: A row is claimed only when no older row of its memory is pending (the
#: ``heads``), and then with every later pending row of that memory (the
#: ``tails``, which no other worker can claim meanwhile: their head is
#: pending). So while one worker holds a memory's rows, with the version it
#: read on its way to Typesense, another worker leaves that memory's newer
#: rows alone; it takes them once the first has committed, and then reads
#: the newer version. Without this, a second service process could import a
#: rewrite first and the first process' older version land on top of it.
_CLAIM = f"""
WITH heads AS (
    SELECT o.id, o.tenant, o.memory_id FROM outbox o
    WHERE o.processed_at IS NULL
      AND NOT EXISTS (
          SELECT 1 FROM outbox e
          WHERE e.tenant = o.tenant AND e.memory_id = o.memory_id
            AND e.processed_at IS NULL AND e.id < o.id
      )
    ORDER BY o.id
    LIMIT %s FOR UPDATE OF o SKIP LOCKED
),
tails AS (
    SELECT o.id, o.tenant, o.memory_id FROM outbox o
    JOIN heads h ON o.tenant = h.tenant AND o.memory_id = h.memory_id
    WHERE o.processed_at IS NULL AND o.id > h.id
    FOR UPDATE OF o SKIP LOCKED
),
claimed AS (SELECT * FROM heads UNION ALL SELECT * FROM tails)
SELECT c.id AS outbox_id, c.tenant AS outbox_tenant, c.memory_id AS outbox_memory_id, {RECORD_COLUMNS}
FROM claimed c LEFT JOIN memories m ON m.tenant = c.tenant AND m.id = c.memory_id
ORDER BY c.id
"""


class TypesenseWriter(Protocol):
    """What the worker needs of the Typesense index (see ``indexers.typesense``)."""

    async def upsert(self, records: Sequence[MemoryRecord], collections: Mapping[str, str] | None = None) -> None: ...

    async def delete(self, keys: Sequence[tuple[str, str]], collections: Mapping[str, str] | None = None) -> None: ...


#: Whether an outbox row migration 26 queued is still pending (uses ``outbox_pending``).
_REWRITE_PENDING = f"""
SELECT EXISTS (
    SELECT 1 FROM outbox
    WHERE processed_at IS NULL
      AND id <= (SELECT value::bigint FROM braid_meta WHERE key = '{TERM_KEY_REWRITE}')
)
"""


class TermKeyRewrite:
    """Whether Typesense may still hold keyword documents whose terms are
    behind the tenant's whole key (written before migration 26 shortened it
    to :func:`~indexers.typesense.documents.term_key`): until every outbox
    row that migration queued has been processed. Starts ``True``; the
    outbox worker clears it (:meth:`check`), and it never turns back on.
    While it holds, the ``bm25`` filters name each term in both forms."""

    def __init__(self) -> None:
        self.pending = True
        #: A check found it pending (so its end is worth a log line; a new
        #: database never had one).
        self._seen_pending = False

    def __call__(self) -> bool:
        return self.pending

    async def check(self, pool: AsyncConnectionPool) -> bool:
        """Read whether the rewrite is still pending (one indexed look-up);
        returns :attr:`pending`."""
        if self.pending:
            async with pool.connection() as conn:
                cur = await conn.execute(_REWRITE_PENDING)
                row = await cur.fetchone()
            self.pending = bool(row and row[0])
            if self.pending:
                self._seen_pending = True
            elif self._seen_pending:
                log.info("migration 26 done: keyword documents all hold their terms behind the term key")
        return self.pending


class OutboxSync:
    def __init__(
        self,
        store: PostgresStore,
        index: TypesenseWriter,
        *,
        dsn: str,
        batch_size: int = 256,
        max_retry_ms: int = 2000,
        workers: int = 1,
        rewrite: TermKeyRewrite | None = None,
    ) -> None:
        #: Cleared once the outbox holds no pending row of migration 26's
        #: rewrite (checked after each batch that emptied the outbox).
        self.rewrite = rewrite or TermKeyRewrite()
        self._store = store
        self._index = index
        self._dsn = dsn
        self._batch_size = batch_size
        self._max_retry = max_retry_ms / 1000.0
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        #: One wake-up event per worker loop, each replaced by its loop after a wait.
        self._wakes = [anyio.Event() for _ in range(workers)]
        #: Set by :meth:`stop`: the loop ends after the batch in hand.
        self._stopping = anyio.Event()
        #: Set when :meth:`run`'s loop has ended.
        self._stopped = anyio.Event()
        self.applied = 0
        self.last_error: str | None = None

    @property
    def pool(self) -> AsyncConnectionPool:
        return self._store.pool

    def wake(self) -> None:
        for event in self._wakes:
            event.set()

    async def pending(self) -> int:
        """How many outbox rows wait (:meth:`backlog`'s count)."""
        count, _ = await self.backlog()
        return count

    async def backlog(self) -> tuple[int, float]:
        """The pending outbox rows, and how long ago in seconds the oldest of
        them was written (0.0 when none is pending), in one statement."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*), coalesce(extract(epoch FROM clock_timestamp() - min(created_at)), 0)"
                " FROM outbox WHERE processed_at IS NULL"
            )
            row = await cur.fetchone()
        return (int(row[0]), max(0.0, float(row[1]))) if row else (0, 0.0)

    async def drain_once(self) -> int:
        """Apply one batch; return how many outbox rows it processed.

        Two round trips to Postgres: the claim with the memories' current rows
        (:data:`_CLAIM`), then the rows marked processed with the commit, in
        pipeline mode. A memory whose row is gone is deleted from Typesense."""
        async with self.pool.connection() as conn, conn.pipeline(), conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(_CLAIM, (self._batch_size,))
            rows = await cur.fetchall()
            if not rows:
                return 0
            current: dict[tuple[str, str], MemoryRecord] = {}
            keys: dict[tuple[str, str], None] = {}
            for row in rows:
                key = (row["outbox_tenant"], row["outbox_memory_id"])
                keys[key] = None
                if row["id"] is not None:
                    current[key] = record_from_row(row)
            await self.apply(list(keys), current=current)
            await conn.execute(
                "UPDATE outbox SET processed_at = clock_timestamp() WHERE id = ANY(%s)",
                ([r["outbox_id"] for r in rows],),
            )
        self.applied += len(rows)
        return len(rows)

    async def apply(
        self,
        keys: Sequence[tuple[str, str]],
        collections: Mapping[str, str] | None = None,
        *,
        current: Mapping[tuple[str, str], MemoryRecord] | None = None,
    ) -> None:
        """Make ``collections`` (a keyword collection, with its vectors one,
        for each group alias of ``keys``' tenants; default: those behind the
        aliases) match Postgres for ``keys``:
        ``current`` holds their current rows (read here when not given; a
        key it lacks is a memory that is gone)."""
        if current is None:
            current = await self._store.fetch_records(keys)
        upserts = [current[k] for k in keys if k in current]
        deletes = [k for k in keys if k not in current]
        if upserts:
            await self._index.upsert(upserts, collections=collections)
        if deletes:
            await self._index.delete(deletes, collections=collections)

    async def purge(self) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(f"DELETE FROM outbox WHERE processed_at < now() - interval '{RETENTION}'")

    async def run(self) -> None:
        """Run until cancelled, or until :meth:`stop`: ``workers`` loops, each
        applying one batch at a time (their claims never overlap, as those of
        several processes do not, :data:`_CLAIM`), so a batch waiting on
        Typesense does not hold back the rows committed after it."""
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._listen)
                async with anyio.create_task_group() as loops:
                    for worker in range(len(self._wakes)):
                        loops.start_soon(self._loop, worker)
                tg.cancel_scope.cancel()
        finally:
            self._stopped.set()

    async def stop(self, timeout: float = STOP_S) -> bool:
        """Let the batch in hand finish (its import and its commit), then end
        :meth:`run`, waiting at most ``timeout`` seconds for it; whether it
        ended. What is still pending stays in the outbox for the next start
        (a cancelled batch too: its rows stay pending, and imports are
        upserts)."""
        self._stopping.set()
        self.wake()
        with anyio.move_on_after(timeout):
            await self._stopped.wait()
        return self._stopped.is_set()

    async def _loop(self, worker: int = 0) -> None:
        delay = 0.05
        purged_at = 0.0
        while not self._stopping.is_set():
            try:
                n = await self.drain_once()
                if self.last_error is not None:
                    log.info("outbox sync recovered")
                self.last_error = None
                delay = 0.05
            except (SourceUnavailable, BackendError, psycopg.Error, OSError) as exc:
                if self.last_error is None:
                    log.warning("outbox sync paused: %s", exc)
                self.last_error = str(exc)
                with anyio.move_on_after(delay):
                    await self._stopping.wait()
                delay = min(delay * 2, self._max_retry)
                continue
            if n >= self._batch_size or self._stopping.is_set():
                continue
            # A short batch took every row committed before it began; a write
            # committed since has notified (the wait then returns at once),
            # so no claim is spent finding the outbox empty. The first
            # worker alone does the checks and the purge.
            if worker == 0 and self.rewrite.pending:
                try:
                    await self.rewrite.check(self.pool)
                except psycopg.Error as exc:
                    log.warning("outbox rewrite check failed: %s", exc)
            now = anyio.current_time()
            if worker == 0 and now - purged_at > 60:
                purged_at = now
                try:
                    await self.purge()
                except psycopg.Error as exc:
                    log.warning("outbox purge failed: %s", exc)
            with anyio.move_on_after(1.0):
                await self._wakes[worker].wait()
            self._wakes[worker] = anyio.Event()

    async def _listen(self) -> None:
        """Turn ``NOTIFY braid_outbox`` from any process into a wake-up."""
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self._dsn, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    async for _ in conn.notifies():
                        self.wake()
            except psycopg.Error as exc:
                log.debug("outbox listener reconnecting: %s", exc)
                await anyio.sleep(1.0)
