"""The sweeper: removes expired memories (:mod:`indexers.lifecycle`) from every store.

Every ``lifecycle.sweepIntervalS`` it runs :meth:`PostgresStore.sweep` batch
after batch (``lifecycle.sweepBatch`` memories each, one transaction per
batch) until a batch comes back short, then drops the relation tombstones
older than ``indexers.graph_cache.TOMBSTONE_KEEP``. Each batch deletes the rows from
Postgres and leaves an outbox ``delete`` per memory in the same transaction,
so Typesense loses them through :mod:`indexers.sync`; a Typesense outage only
delays that (the outbox retries), and nothing that has not expired is
touched. Several service processes may sweep at once: a batch skips rows
another one holds. The rule and the batch are read from the live config.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

import anyio
import msgspec
import psycopg
from psycopg_pool import PoolTimeout

from config import BraidConfig

from .lifecycle import Forgetting
from .postgres import PostgresStore

__all__ = ["SweepStats", "Sweeper"]

log = logging.getLogger("braid.sweep")


class SweepStats(msgspec.Struct):
    #: Expired memories this process removed since it started.
    swept: int
    #: When this process's last sweep finished (or failed), None before the first.
    last_run: datetime | None
    #: Memories that sweep removed.
    last_swept: int
    #: Why the last sweep failed (it is retried at the next interval), else None.
    error: str | None


class Sweeper:
    def __init__(self, store: PostgresStore, get_config: Callable[[], BraidConfig]) -> None:
        self._store = store
        self._get_config = get_config
        self.swept = 0
        self.last_run: datetime | None = None
        self.last_swept = 0
        self.error: str | None = None

    def stats(self) -> SweepStats:
        return SweepStats(swept=self.swept, last_run=self.last_run, last_swept=self.last_swept, error=self.error)

    async def sweep(self) -> int:
        """Remove every memory expired now, batch by batch; return how many went."""
        removed = 0
        try:
            while True:
                cfg = self._get_config()
                batch = cfg.lifecycle.sweep_batch
                done = sum((await self._store.sweep(Forgetting.from_config(cfg), batch)).values())
                removed += done
                self.swept += done
                if done < batch:
                    break
            await self._store.drop_tombstones()
        except (psycopg.Error, PoolTimeout, OSError) as exc:
            if self.error is None:
                log.warning("sweep failed, retried at the next interval: %s", exc)
            self.error = str(exc).strip() or type(exc).__name__
        else:
            if self.error is not None:
                log.info("sweeps work again")
            self.error = None
        finally:
            self.last_run = datetime.now(UTC)
            self.last_swept = removed
        if removed:
            log.info("swept %d expired memories", removed)
        return removed

    async def run(self) -> None:
        """Sweep every ``lifecycle.sweepIntervalS`` until cancelled."""
        while True:
            await anyio.sleep(self._get_config().lifecycle.sweep_interval_s)
            await self.sweep()
