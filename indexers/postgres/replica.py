"""Reading recalls from a Postgres streaming replica, with read-your-writes.

The replica (``postgres.replicaDsn``) is a hot standby replaying the primary's
WAL; a recall may read it only once it has replayed past the tenant's last
write. After each write of a tenant commits, the engine reads the primary's
WAL insert position (:func:`primary_lsn`) and records it here
(:meth:`ReplicaRouter.wrote`); a recall asks :meth:`ReplicaRouter.use_replica`,
which compares that position with the replica's replay position
(``pg_last_wal_replay_lsn()``). The replay position is cached: it is read
again only when a tenant's write is ahead of the cached value, so a recall of
a tenant that did not write lately costs the replica no extra round trip.

The guarantee is per process: only the writes this process made are known
here. A client behind a load balancer keeps read-your-writes by passing the
``Braid-Lsn`` header a write answered with on its next recall (``at_least``).

A replica that fails a read, or whose replay position cannot be read within
:data:`PROBE_TIMEOUT_S`, is taken out: recalls go to the primary, and
:meth:`ReplicaRouter.run` probes it again every :data:`RETRY_S` in the
background (no request waits on a replica that is out). It starts out, until
the first probe reads it.
"""

from __future__ import annotations

import logging
import re
from typing import Literal

import anyio
import msgspec
import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ..base import failure_reason

__all__ = [
    "PROBE_TIMEOUT_S",
    "RETRY_S",
    "ReplicaRouter",
    "ReplicaStats",
    "format_lsn",
    "parse_lsn",
    "primary_lsn",
]

log = logging.getLogger("braid")

#: The longest a recall waits to read the replica's replay position.
PROBE_TIMEOUT_S = 0.5

#: How long a replica that failed stays out before it is probed again.
RETRY_S = 1.0

#: Tenants whose last write position one process keeps; past that the
#: positions the replica has replayed are dropped, then all of them (a floor
#: every tenant must then wait for keeps the guarantee).
MAX_TENANTS = 100_000

_LSN_RE = re.compile(r"([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})")


def parse_lsn(text: str) -> int:
    """A WAL position as Postgres prints it (``16/B374D848``), as an integer."""
    m = _LSN_RE.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"not a WAL position: {text!r} (expected e.g. '16/B374D848')")
    return (int(m[1], 16) << 32) | int(m[2], 16)


def format_lsn(lsn: int) -> str:
    """The inverse of :func:`parse_lsn`."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


async def primary_lsn(pool: AsyncConnectionPool) -> int:
    """The primary's WAL position, read after a write's commit returned: at or
    past the end of that commit's record.

    The position is server-wide, so any session of the pool (same role, same
    settings as the writer's) can read it once the commit has returned. With
    ``synchronous_commit`` on (the default; ``local`` and the remote levels
    too) the commit returned after its record was flushed, so the write
    position ``pg_current_wal_lsn()`` is past it. With ``off`` it may not be
    yet, and the insert position ``pg_current_wal_insert_lsn()`` is read
    instead: always past it, but on an idle server just past a page header
    the replica reaches only with the next record (the write position is the
    default for that reason: recalls would read the primary until then).
    """
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT (CASE WHEN current_setting('synchronous_commit') = 'off'"
            " THEN pg_current_wal_insert_lsn() ELSE pg_current_wal_lsn() END)::text"
        )
        row = await cur.fetchone()
    assert row is not None
    return parse_lsn(row[0])


class ReplicaStats(msgspec.Struct, frozen=True):
    #: ``up``: recalls may read it; ``down``: a read or probe failed, retried in the background.
    status: Literal["up", "down"]
    #: Its replay position when last read (None before the first read).
    replayed_lsn: str | None
    #: Recalls answered from the replica, and from the primary, by this process.
    served_replica: int
    served_primary: int
    #: Recalls begun on the replica that a failed read sent to the primary.
    fallbacks: int
    #: Times the replay position was read.
    probes: int


class ReplicaRouter:
    """Which Postgres a tenant's recall reads (module docstring)."""

    def __init__(
        self,
        pool: AsyncConnectionPool,
        primary: AsyncConnectionPool,
        *,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
        retry_s: float = RETRY_S,
        max_tenants: int = MAX_TENANTS,
    ) -> None:
        self.pool = pool
        self.primary = primary
        self.probe_timeout_s = probe_timeout_s
        self.retry_s = retry_s
        self.max_tenants = max_tenants
        #: tenant -> the primary's WAL position after its last write here.
        self._written: dict[str, int] = {}
        #: Every tenant waits for this one (set when the map above is cleared).
        self._floor = 0
        #: Tenants whose write committed but whose position could not be read:
        #: they read the primary until :meth:`run` reads one after the fact.
        self._unknown: set[str] = set()
        self._replayed = 0
        #: Out until a probe reads its replay position (so at first too).
        self._down = True
        self._probing: anyio.Lock | None = None
        self.served_replica = 0
        self.served_primary = 0
        self.fallbacks = 0
        self.probes = 0
        self._ever_read = False

    # --- writes ---------------------------------------------------------------

    def wrote(self, tenant: str, lsn: int) -> None:
        """Record that ``tenant``'s write committed at or before ``lsn``."""
        if len(self._written) >= self.max_tenants and tenant not in self._written:
            self._written = {t: w for t, w in self._written.items() if w > self._replayed}
            if len(self._written) >= self.max_tenants:
                self._floor = max(self._floor, *self._written.values())
                self._written.clear()
        if lsn > self._written.get(tenant, 0):
            self._written[tenant] = lsn

    def wrote_before(self, lsn: int) -> None:
        """Every tenant's recalls wait for ``lsn``: the primary's position when
        the process started, so that writes made before (by an earlier run of
        it, which kept their positions in memory) are not missed after a restart."""
        self._floor = max(self._floor, lsn)

    def wrote_unknown(self, tenant: str) -> None:
        """``tenant``'s write committed but the primary's position could not be
        read: its recalls read the primary until :meth:`run` reads a position
        (any read after the commit is past it)."""
        self._unknown.add(tenant)

    def last_write(self, tenant: str) -> int:
        """The position a recall of ``tenant`` must see (0: any)."""
        return max(self._written.get(tenant, 0), self._floor)

    # --- recalls --------------------------------------------------------------

    @property
    def up(self) -> bool:
        return not self._down

    async def use_replica(self, tenant: str, at_least: int = 0) -> bool:
        """True when a recall of ``tenant`` may read the replica: it is up and
        has replayed past the tenant's last write here and past ``at_least``
        (a position the client brought)."""
        if not self.up or tenant in self._unknown:
            return False
        needed = max(self.last_write(tenant), at_least)
        if needed <= self._replayed:
            return True
        replayed = await self._probe()
        return replayed is not None and needed <= replayed

    def served(self, replica: bool) -> None:
        if replica:
            self.served_replica += 1
        else:
            self.served_primary += 1

    def failed(self, reason: str) -> None:
        """A read on the replica failed: the recall goes to the primary, and so
        do the next ones until a background probe finds it back."""
        self.fallbacks += 1
        self._mark_down(reason)

    def _mark_down(self, reason: str) -> None:
        if self.up:
            log.warning("Postgres replica out, recalls read the primary until it answers again: %s", reason)
        self._down = True

    async def _probe(self) -> int | None:
        """Read the replay position (one read at a time: concurrent recalls
        wait for it and use what it read); None when it cannot be read."""
        if self._probing is None:
            self._probing = anyio.Lock()
        seen = self.probes
        async with self._probing:
            if self.probes != seen:
                # Another recall read it while this one waited.
                return self._replayed if self.up else None
            self.probes += 1
            try:
                with anyio.fail_after(self.probe_timeout_s):
                    async with self.pool.connection(timeout=self.probe_timeout_s) as conn:
                        cur = await conn.execute("SELECT pg_last_wal_replay_lsn()::text")
                        row = await cur.fetchone()
            except (TimeoutError, PoolTimeout, psycopg.Error) as exc:
                self._mark_down(f"its replay position could not be read: {failure_reason(exc, self.probe_timeout_s)}")
                return None
            if row is None or row[0] is None:
                self._mark_down("it is not a standby (pg_last_wal_replay_lsn() is null)")
                return None
            if self._down:
                log.info("Postgres replica %s, recalls read it", "back" if self._ever_read else "up")
            self._replayed = max(self._replayed, parse_lsn(row[0]))
            self._ever_read = True
            self._down = False
            return self._replayed

    async def run(self) -> None:
        """Probe the replica at once, then every :attr:`retry_s` while it is
        out; read the primary's position for the tenants whose write's is unknown."""
        while True:
            if self._down:
                if self._ever_read:
                    # Connections left from before it went away are dropped, not
                    # handed to the recalls that follow the probe.
                    with anyio.move_on_after(self.probe_timeout_s):
                        await self.pool.check()
                await self._probe()
            if self._unknown:
                await self._resolve_unknown()
            await anyio.sleep(self.retry_s)

    async def _resolve_unknown(self) -> None:
        waiting = set(self._unknown)
        try:
            with anyio.fail_after(self.probe_timeout_s):
                lsn = await primary_lsn(self.primary)
        except (TimeoutError, PoolTimeout, psycopg.Error):
            return
        for tenant in waiting:
            self.wrote(tenant, lsn)
        self._unknown -= waiting

    def stats(self) -> ReplicaStats:
        return ReplicaStats(
            status="up" if self.up else "down",
            replayed_lsn=format_lsn(self._replayed) if self._ever_read else None,
            served_replica=self.served_replica,
            served_primary=self.served_primary,
            fallbacks=self.fallbacks,
            probes=self.probes,
        )
