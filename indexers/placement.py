"""Large tenants moved to Typesense collection pairs of their own, online.

Small tenants share the collection groups (``typesense.groups``); a tenant
with ``typesense.ownCollectionAbove`` memories or more is moved by the
``placement`` admin job (``POST /admin/reindex {"target": "placement"}``)
into the pair behind :func:`~indexers.typesense.placement.own_alias`. A move
(:func:`move_tenant`), with recalls and writes going on throughout:

1. the pair is made and the tenant recorded ``copying`` in
   ``typesense_placements``: from then on every process writes the tenant's
   memories to its group *and* its pair, and still searches the group;
2. after :data:`SETTLE_S` (every process has read the row), the tenant's
   memories are copied from a snapshot of Postgres into the pair, and every
   memory of the tenant the outbox saw since shortly before the snapshot is
   re-applied from its current row;
3. the tenant is recorded ``live``: searches read the pair, writes go there
   only; after :data:`SETTLE_S` the replay is repeated (for writes that raced
   the switch) and the tenant's documents are deleted from the group.

A move cut short leaves the row ``copying`` (writes keep going to both, and
searches to the group); the next ``placement`` job starts that tenant's move
again. One cut short while clearing the group leaves the tenant ``live`` with
documents in its group (searches of the group's other tenants skip them, at
some cost); the next job clears them (:func:`moved_with_leftovers`). Postgres stays the truth: a Typesense reindex rebuilds each moved
tenant's pair beside the groups.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import anyio
import psycopg
from psycopg_pool import AsyncConnectionPool

from .base import MemoryRecord
from .snapshot import copy_snapshot
from .sync import OutboxSync
from .typesense import TypesenseGroups
from .typesense.documents import document_id, tenant_key, vectors_alias
from .typesense.placement import REFRESH_S, Placed, Placements, own_alias

__all__ = [
    "SETTLE_S",
    "PlacementWatcher",
    "clear_group",
    "move_tenant",
    "moved_with_leftovers",
    "read_placements",
    "replay",
    "tenants_to_move",
]

log = logging.getLogger("braid.placement")

#: How long a move waits after each step for every process to have read it
#: (two refreshes and a margin).
SETTLE_S = 2 * REFRESH_S + 1.0
#: Memories re-applied per outbox apply in a replay.
BATCH = 500
#: Replay window before the snapshot (as a reindex's).
REPLAY_MARGIN = timedelta(seconds=60)


async def read_placements(pool: AsyncConnectionPool) -> dict[str, Placed]:
    """Every row of ``typesense_placements``."""
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT tenant, alias, state FROM typesense_placements")
        return {tenant: Placed(alias, state) for tenant, alias, state in await cur.fetchall()}


class PlacementWatcher:
    """Keeps a :class:`Placements` in step with Postgres (every :data:`REFRESH_S`)."""

    def __init__(self, pool: AsyncConnectionPool, placements: Placements) -> None:
        self._pool = pool
        self.placements = placements

    async def refresh(self) -> None:
        self.placements.replace(await read_placements(self._pool))

    async def run(self) -> None:
        """Refresh until cancelled; a failed read keeps the last view."""
        while True:
            await anyio.sleep(REFRESH_S)
            try:
                await self.refresh()
            except psycopg.Error as exc:
                log.warning("reading typesense_placements failed, keeping the last view: %s", exc)


async def replay(
    pool: AsyncConnectionPool,
    sync: OutboxSync,
    index: TypesenseGroups,
    since: Any,
    collections: dict[str, str],
    tenant: str | None = None,
) -> int:
    """Re-apply every memory (of ``tenant``, if given) the outbox saw since
    ``since`` (it keeps processed rows for an hour) from its current row, to
    those of its aliases ``collections`` names, into the collections it
    names; returns how many memories."""
    async with pool.connection() as conn:
        if tenant is None:
            cur = await conn.execute("SELECT DISTINCT tenant, memory_id FROM outbox WHERE created_at >= %s", (since,))
        else:
            cur = await conn.execute(
                "SELECT DISTINCT tenant, memory_id FROM outbox WHERE created_at >= %s AND tenant = %s",
                (since, tenant),
            )
        keys = [(t, m) for t, m in await cur.fetchall() if set(index.write_aliases(t)) & collections.keys()]
    for i in range(0, len(keys), BATCH):
        await sync.apply(keys[i : i + BATCH], collections=collections)
    return len(keys)


async def clear_group(pool: AsyncConnectionPool, index: TypesenseGroups, tenant: str) -> int:
    """Delete a moved tenant's documents from its group's collections: by id,
    100 a request (one filtered delete of 30,000 vector documents outlasted
    ``typesense.timeoutMs``: ``benchmarks/results/placement-*.md``), then by
    filter for any left (a memory deleted meanwhile); returns how many went."""
    group = index.group_of(tenant)
    client = index.client_of(group)
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT id FROM memories WHERE tenant = %s", (tenant,))
        ids = [document_id(tenant, memory_id) for (memory_id,) in await cur.fetchall()]
    behind = await client.list_aliases()
    deleted = 0
    for name in dict.fromkeys(n for n in (behind.get(group), behind.get(vectors_alias(group))) if n is not None):
        deleted += await client.delete_documents(name, ids)
        deleted += await client.delete_where(name, f"tenant_key:={tenant_key(tenant)}")
    return deleted


async def moved_with_leftovers(pool: AsyncConnectionPool, index: TypesenseGroups) -> list[str]:
    """Tenants moved (``live``) whose group still holds documents of theirs
    (a move that failed while clearing its group)."""
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT tenant FROM typesense_placements WHERE state = 'live' ORDER BY tenant")
        live = [tenant for (tenant,) in await cur.fetchall()]
    left = []
    for tenant in live:
        group = index.group_of(tenant)
        client = index.client_of(group)
        for alias in dict.fromkeys((group, vectors_alias(group) if index.vectors else group)):
            if await client.count(alias, f"tenant_key:={tenant_key(tenant)}") > 0:
                left.append(tenant)
                break
    return left


async def tenants_to_move(pool: AsyncConnectionPool, threshold: int) -> list[tuple[str, int]]:
    """Tenants with ``threshold`` memories or more not ``live`` in a pair of
    their own, largest first, with their memory counts."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT m.tenant, count(*) FROM memories m"
            " WHERE NOT EXISTS (SELECT 1 FROM typesense_placements p WHERE p.tenant = m.tenant AND p.state = 'live')"
            " GROUP BY m.tenant HAVING count(*) >= %s ORDER BY count(*) DESC, m.tenant",
            (threshold,),
        )
        return [(tenant, int(n)) for tenant, n in await cur.fetchall()]


async def _record(pool: AsyncConnectionPool, tenant: str, alias: str, state: str) -> None:
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO typesense_placements (tenant, alias, state) VALUES (%s, %s, %s)"
            " ON CONFLICT (tenant) DO UPDATE SET alias = excluded.alias, state = excluded.state,"
            " placed_at = clock_timestamp()",
            (tenant, alias, state),
        )


async def move_tenant(
    pool: AsyncConnectionPool,
    index: TypesenseGroups,
    sync: OutboxSync,
    watcher: PlacementWatcher,
    tenant: str,
    report: Callable[[dict[str, Any]], Awaitable[None]],
    *,
    settle_s: float = SETTLE_S,
) -> None:
    """Move ``tenant`` to its own pair (the module's steps); ``report`` gets
    each step's progress."""
    alias = own_alias(index.alias, tenant)
    group = index.group_of(tenant)
    own = index.own_index(tenant)
    await own.ensure()
    await _record(pool, tenant, alias, "copying")
    await watcher.refresh()
    await report({"tenant": tenant, "alias": alias, "phase": "settling", "done": 0})
    await anyio.sleep(settle_s)

    target = await own.current_collection()
    assert target is not None

    async def write(records: list[MemoryRecord]) -> None:
        # Not `fresh`: the outbox writes to the pair meanwhile.
        await index.upsert(records, collections={alias: target})

    async def progress(done: int, total: int) -> None:
        await report({"phase": "copying", "done": done, "total": total})

    snapshot_at = await copy_snapshot(pool, write, progress, tenant=tenant)
    since = snapshot_at - REPLAY_MARGIN
    await report({"phase": "replaying", "since": since.isoformat()})
    await replay(pool, sync, index, since, {alias: target}, tenant)

    await _record(pool, tenant, alias, "live")
    await watcher.refresh()
    await report({"phase": "live"})
    await anyio.sleep(settle_s)
    await replay(pool, sync, index, since, {alias: target}, tenant)
    left = await clear_group(pool, index, tenant)
    await report({"phase": "moved", "deleted_from_group": left})
    log.info("tenant %s moved to %s, %d documents left its group %s", tenant, alias, left, group)
