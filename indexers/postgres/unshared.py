"""Which written rows stay out of their tier's shared HNSW index.

A memory tier's shared HNSW index leaves out the rows flagged ``own``
(``WHERE tier = ... AND NOT own``, :mod:`indexers.own_index`), and every
search of a tenant that the index leaves rows of compares those rows exactly
beside its walk (their btree: ``memories_own``), so a flag changes the cost
of a search, never its rows. Two kinds of rows are flagged on write:

- the rows of a tenant with an index of its own in the tier (that index
  holds them);
- the rows of a tenant holding at most the tier's ``exactBelow`` rows there,
  counting the write: every search of such a tenant compares its rows
  exactly (:func:`indexers.pgvector.nearest_sql`) and never walks the index,
  so inserting them into it buys nothing and is the dearest part of a write
  (with 100,000 rows in the shared indexes, a small tenant's memory cost
  3.01 ms of Postgres CPU inserted and 0.11 ms flagged:
  ``benchmarks/results/unshared-writes.md``). A deployment of many small
  tenants writes almost nothing into the shared graphs.

The rows of a tier whose searches rank by a fold (``decayed``) are never
flagged small: the fold's index holds every row of its epoch.

Entities are the same in the entity tier (``entities.small``, the
entities' HNSW index ``WHERE NOT small``, the graph's seed search with the
flagged ones compared exactly beside its walk): an entity of a tenant with
at most the entity tier's ``exactBelow`` entities, counting the write's new
ones, is flagged (3.81 against 0.09 ms an entity, the entity index holding
100,000). An entity rewritten keeps its flag.

Once a write takes a tenant past ``exactBelow`` in a tier, its searches may
walk the shared index, and its flagged rows move into it: each later write
of the tenant in that tier clears the flag of up to :data:`MOVE_BATCH` of
them (rows another transaction holds are skipped, never waited for), so no
single write pays for them all. Until they have moved, searches find them
exactly beside the walk. Rows flagged by a write that raced another one
across the threshold are moved by the tenant's next write in that tier.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

from .models import MemoryInput

__all__ = ["MOVE_BATCH", "flag_entities", "flag_rows", "is_small", "move_entities", "move_rows"]

#: Flagged rows of a tenant past ``exactBelow`` that one write moves into
#: the tier's shared index at most (each an HNSW insert: ~3 ms of Postgres
#: CPU at 100,000 rows, so about 0.8 s a write, well inside the write's 10 s).
MOVE_BATCH = 256


def _bounded_count(rows: str, bound: str) -> str:
    """A statement counting ``rows`` up to ``bound``: a small tenant's rows
    are counted from their btree, a large one's cost no more than the bound."""
    return f"SELECT count(*) FROM ({rows} LIMIT {bound}) AS c"


_MEMORY_COUNT_SQL = _bounded_count("SELECT 1 FROM memories WHERE tenant = %s AND tier = %s", "%s")
_ENTITY_COUNT_SQL = _bounded_count("SELECT 1 FROM entities WHERE tenant = %s", "%s")

#: A tier's own-index flag and the tenant's rows in it, counted up to ``bound``.
_PLACES_SQL = (
    "SELECT t.tier, braid_own_index(%(tenant)s, t.tier), ("
    + _bounded_count("SELECT 1 FROM memories m WHERE m.tenant = %(tenant)s AND m.tier = t.tier", "t.bound")
    + ") FROM unnest(%(tiers)s::text[], %(bounds)s::int[]) AS t(tier, bound)"
)

#: (Materialized: ``id IN (SELECT ... LIMIT n)`` may run its subquery again
#: and change more than ``n`` rows.)
_MOVE_SQL = """
    WITH picked AS MATERIALIZED (
        SELECT id FROM memories WHERE tenant = %(tenant)s AND tier = %(tier)s AND own
        LIMIT %(batch)s FOR UPDATE SKIP LOCKED
    )
    UPDATE memories m SET own = false FROM picked
    WHERE m.tenant = %(tenant)s AND m.id = picked.id
"""


async def flag_rows(
    conn: psycopg.AsyncConnection[Any],
    tenant: str,
    memories: Sequence[MemoryInput],
    epochs: Sequence[int | None],
    exact_below: Mapping[str, int] | None,
) -> tuple[list[bool], list[str]]:
    """Each memory's ``own`` flag (``epochs``: each one's fold epoch, None
    in a tier ranked by cosine), and the tiers whose flagged rows the write
    then moves into the shared index (:func:`move_rows`), in the caller's
    write transaction, before its rows are written.

    ``exact_below``: each memory tier's ``exactBelow``; a tier missing from
    it (or None for all) flags only the rows of a tenant with an index of
    its own there."""
    limits = exact_below or {}
    new = Counter(m.tier for m in memories)
    tiers = sorted(new)
    cur = await conn.execute(
        _PLACES_SQL,
        {"tenant": tenant, "tiers": tiers, "bounds": [limits.get(t, -1) + 1 for t in tiers]},
    )
    small: set[str] = set()
    own: set[str] = set()
    move: list[str] = []
    for tier, has_index, count in await cur.fetchall():
        if has_index:
            own.add(tier)
        elif tier in limits:
            # The write's rows count as new: a rewrite counted twice only
            # moves a tenant into the shared index a little early.
            if count + new[tier] <= limits[tier]:
                small.add(tier)
            else:
                move.append(tier)
    flags = [m.tier in own or (m.tier in small and epoch is None) for m, epoch in zip(memories, epochs, strict=True)]
    return flags, move


async def _count(conn: psycopg.AsyncConnection[Any], statement: str, params: tuple[Any, ...]) -> int:
    cur = await conn.execute(statement, params)
    row = await cur.fetchone()
    return 0 if row is None else int(row[0])


async def is_small(conn: psycopg.AsyncConnection[Any], tenant: str, tier: str, exact_below: int) -> bool:
    """Whether ``tenant`` holds at most ``exact_below`` rows in ``tier``, so
    its rows stay out of the tier's shared index."""
    return await _count(conn, _MEMORY_COUNT_SQL, (tenant, tier, exact_below + 1)) <= exact_below


async def move_rows(conn: psycopg.AsyncConnection[Any], tenant: str, tiers: Sequence[str]) -> int:
    """Clear the flag of up to :data:`MOVE_BATCH` flagged rows of ``tenant``
    in each of ``tiers`` (none of them the tenant's own index's), which puts
    them in the tier's shared index; the rows moved. Run it after the
    write's own rows: it waits on no one (rows held elsewhere are skipped)."""
    moved = 0
    for tier in tiers:
        cur = await conn.execute(_MOVE_SQL, {"tenant": tenant, "tier": tier, "batch": MOVE_BATCH})
        moved += cur.rowcount
    return moved


_ENTITY_MOVE_SQL = """
    WITH picked AS MATERIALIZED (
        SELECT id FROM entities WHERE tenant = %(tenant)s AND small
        LIMIT %(batch)s FOR UPDATE SKIP LOCKED
    )
    UPDATE entities e SET small = false FROM picked
    WHERE e.tenant = %(tenant)s AND e.id = picked.id
"""


async def flag_entities(
    conn: psycopg.AsyncConnection[Any], tenant: str, new: int, exact_below: int | None
) -> tuple[bool, bool]:
    """Whether the ``new`` entities a write inserts for ``tenant`` are
    flagged ``small`` (at most ``exact_below`` entities, counting them; None:
    never), and whether the write then moves flagged ones into the index
    (:func:`move_entities`: the tenant is past ``exact_below``)."""
    if exact_below is None:
        return False, False
    small = await _count(conn, _ENTITY_COUNT_SQL, (tenant, exact_below + 1)) + new <= exact_below
    return small, not small


async def move_entities(conn: psycopg.AsyncConnection[Any], tenant: str) -> int:
    """Clear the flag of up to :data:`MOVE_BATCH` of ``tenant``'s flagged
    entities, in the caller's transaction after its upserts: rows another
    transaction holds are skipped, so the move waits on no one, and the
    upserts (in name order) are not interleaved with it. The entities moved."""
    cur = await conn.execute(_ENTITY_MOVE_SQL, {"tenant": tenant, "batch": MOVE_BATCH})
    return cur.rowcount
