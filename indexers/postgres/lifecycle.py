"""Supersession: a memory's ``mem_key`` and its lifecycle, inside the write's
transaction.

A tenant's memories with one ``mem_key`` are the versions of one fact. At
most one is current (``superseded_at IS NULL``); each retired one names the
version that followed it (``superseded_by``) and when (``superseded_at``,
that version's ``created_at``), so a recall ``as_of`` a past instant sees the
version current then.

Writers of a key serialise on a transaction-level advisory lock per
``(tenant, mem_key)`` (:func:`lock_keys`), taken before any row lock and in
one order, so fifty concurrent writers of a key leave exactly one current
memory and never deadlock. A delete takes the key's lock before the row's
(:func:`lock_memory`), as a write does.

A rewrite of an id is a new write of its key: it is stored current and
supersession runs again (it may be retired at once as a backfill). A rewrite
that changes or drops the key leaves the old key's versions as they are: if
it was the old key's current memory, that key has none until its next write.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

import msgspec
import psycopg

from .models import MemoryInput

__all__ = ["Deleted", "Written", "lock_keys", "lock_memory", "restore_newest", "supersede"]

#: The advisory lock of one tenant's key (a tenant name has no colon).
_KEY_LOCK = "hashtextextended('braid-key:' || %s || ':' || k, 0)"


class Written(msgspec.Struct, frozen=True):
    """What a write stored: the memories' ids, in the request's order, and the
    ids of the memories it retired (the keys' current ones before it)."""

    ids: list[str]
    superseded: list[str]


class Deleted(msgspec.Struct, frozen=True):
    deleted: str
    #: The retired version made current again (``restore_previous``), if any.
    restored: str | None = None


async def lock_keys(conn: psycopg.AsyncConnection, tenant: str, keys: Iterable[str]) -> None:
    """Take the transaction's advisory lock of each of ``tenant``'s ``keys``, in sorted order."""
    ordered = sorted(set(keys))
    if ordered:
        await conn.execute(
            f"SELECT pg_advisory_xact_lock({_KEY_LOCK}) FROM unnest(%s::text[]) WITH ORDINALITY AS u(k, n) ORDER BY n",
            (tenant, ordered),
        )


async def lock_memory(conn: psycopg.AsyncConnection, tenant: str, memory_id: str) -> tuple[str | None, bool] | None:
    """Lock a memory for a delete, its key's lock first; its ``(mem_key,
    current)``, or ``None`` if the tenant has no such memory. (A concurrent
    rewrite may change the key between the read and the row lock: then the
    new key is locked too and the row read again.)"""
    while True:
        cur = await conn.execute("SELECT mem_key FROM memories WHERE tenant = %s AND id = %s", (tenant, memory_id))
        seen = await cur.fetchone()
        if seen is None:
            return None
        if seen[0] is not None:
            await lock_keys(conn, tenant, [seen[0]])
        cur = await conn.execute(
            "SELECT mem_key, superseded_at IS NULL FROM memories WHERE tenant = %s AND id = %s FOR UPDATE",
            (tenant, memory_id),
        )
        row = await cur.fetchone()
        if row is None:
            return None
        if row[0] is None or row[0] == seen[0]:
            return row[0], bool(row[1])


async def supersede(
    conn: psycopg.AsyncConnection, tenant: str, ids: Sequence[str], memories: Sequence[MemoryInput]
) -> tuple[list[str], list[str]]:
    """Apply supersession to just-upserted memories (stored current, their
    keys locked): ``(retired, touched)``, the ids of the keys' current
    memories this write retired, and of every other memory whose lifecycle
    it changed (for the outbox).

    The keyed memories are taken oldest first (then in request order), each
    against the key's stored versions and the ones of this write already
    taken: a memory newer than (or as new as) the key's current one retires
    it; an older one (a backfill) is retired at once by the version that
    follows it in time (the current one, unless it fell between two older
    versions), and the version before it, if one then followed it, is
    retired by it instead, so ``as_of`` sees each version in its own time.
    """
    keyed = sorted(
        ((m.created_at, i, mid, m.mem_key) for i, (mid, m) in enumerate(zip(ids, memories, strict=True)) if m.mem_key),
        key=lambda t: (t[0], t[1]),
    )
    retired: list[str] = []
    touched: list[str] = []
    for n, (created, _, mid, key) in enumerate(keyed):
        # This write's versions of the key not taken yet are not there yet.
        pending = [mid, *(later[2] for later in keyed[n + 1 :] if later[3] == key)]
        cur = await conn.execute(
            "SELECT max(created_at) FROM memories"
            " WHERE tenant = %s AND mem_key = %s AND superseded_at IS NULL AND id <> ALL(%s)",
            (tenant, key, pending),
        )
        row = await cur.fetchone()
        newest: datetime | None = None if row is None else row[0]
        if newest is None or newest <= created:
            cur = await conn.execute(
                "UPDATE memories SET superseded_at = %s, superseded_by = %s, updated_at = clock_timestamp()"
                " WHERE tenant = %s AND mem_key = %s AND superseded_at IS NULL AND id <> ALL(%s) RETURNING id",
                (created, mid, tenant, key, pending),
            )
            retired += [r[0] for r in await cur.fetchall()]
            continue
        # A backfill: retired by the version that follows it in time...
        await conn.execute(
            """
            UPDATE memories m SET superseded_at = nx.created_at, superseded_by = nx.id
            FROM (SELECT id, created_at FROM memories
                  WHERE tenant = %(tenant)s AND mem_key = %(key)s AND id <> ALL(%(pending)s)
                    AND created_at > %(created)s
                  ORDER BY created_at, id LIMIT 1) nx
            WHERE m.tenant = %(tenant)s AND m.id = %(mid)s
            """,
            {"tenant": tenant, "key": key, "pending": pending, "created": created, "mid": mid},
        )
        # ...and it retires the version before it, which that one retired until now.
        cur = await conn.execute(
            "UPDATE memories SET superseded_at = %(created)s, superseded_by = %(mid)s, updated_at = clock_timestamp()"
            " WHERE tenant = %(tenant)s AND mem_key = %(key)s AND id <> ALL(%(pending)s)"
            " AND created_at <= %(created)s AND superseded_at > %(created)s RETURNING id",
            {"tenant": tenant, "key": key, "pending": pending, "created": created, "mid": mid},
        )
        touched += [r[0] for r in await cur.fetchall()]
    return retired, [*retired, *touched]


async def restore_newest(conn: psycopg.AsyncConnection, tenant: str, mem_key: str) -> str | None:
    """Make the newest retired version of ``mem_key`` current again, unless
    the key has a current one; its id, or ``None``."""
    cur = await conn.execute(
        """
        UPDATE memories SET superseded_at = NULL, superseded_by = NULL, updated_at = clock_timestamp()
        WHERE tenant = %(tenant)s AND id = (
            SELECT id FROM memories
            WHERE tenant = %(tenant)s AND mem_key = %(key)s AND superseded_at IS NOT NULL
            ORDER BY created_at DESC, id DESC LIMIT 1)
        AND NOT EXISTS (
            SELECT 1 FROM memories
            WHERE tenant = %(tenant)s AND mem_key = %(key)s AND superseded_at IS NULL)
        RETURNING id
        """,
        {"tenant": tenant, "key": mem_key},
    )
    row = await cur.fetchone()
    return None if row is None else str(row[0])
