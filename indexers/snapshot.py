"""Every memory (or one tenant's) read from one consistent snapshot of
Postgres, a batch at a time: what a Typesense reindex and a tenant's move to
its own collection pair copy before replaying the outbox."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime

from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from .base import MemoryRecord
from .postgres import RECORD_COLUMNS, record_from_row

__all__ = ["BATCH", "copy_snapshot"]

#: Memories handed over per batch.
BATCH = 500


async def copy_snapshot(
    pool: AsyncConnectionPool,
    write: Callable[[list[MemoryRecord]], Awaitable[None]],
    progress: Callable[[int, int], Awaitable[None]],
    *,
    tenant: str | None = None,
) -> datetime:
    """Hand every memory (of ``tenant``, if given) to ``write``, :data:`BATCH`
    at a time, all read in one ``REPEATABLE READ`` transaction, and
    ``(done, total)`` to ``progress`` before the first batch and after each;
    returns the snapshot's time (writes committed after it are not seen: the
    caller replays the outbox from shortly before it)."""
    where, params = ("", ()) if tenant is None else (" WHERE m.tenant = %s", (tenant,))
    async with pool.connection() as conn:
        await conn.set_autocommit(False)
        try:
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur = await conn.execute(f"SELECT clock_timestamp(), count(*) FROM memories m{where}", params)
            row = await cur.fetchone()
            assert row is not None
            snapshot_at, total = row
            await progress(0, total)
            done = 0
            async with conn.cursor(name="braid_snapshot", row_factory=dict_row) as named:
                named.itersize = BATCH
                await named.execute(f"SELECT {RECORD_COLUMNS} FROM memories m{where}", params)
                while rows := await named.fetchmany(BATCH):
                    await write([record_from_row(r) for r in rows])
                    done += len(rows)
                    await progress(done, total)
            await conn.commit()
        finally:
            # A failure mid-copy leaves the transaction open: ended first, so that
            # the failure is what is raised, not the autocommit switch's.
            if conn.info.transaction_status != TransactionStatus.IDLE:
                await conn.rollback()
            await conn.set_autocommit(True)
    return snapshot_at  # type: ignore[no-any-return]
