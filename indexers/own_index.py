"""Large tenants' own HNSW indexes in Postgres.

A memory tier's HNSW index is shared by every tenant. A search of one tenant
walks it and skips the other tenants' rows it meets: pgvector's iterative
scan goes on until it holds ``limit`` rows of the tenant, so the smaller the
tenant's share of the tier, the more rows the walk visits for nothing.
Small tenants never walk (at most ``exactBelow`` rows: compared exactly).

A tenant holding ``postgres.ownIndexAbove`` memories or more in a memory tier
ranked by similarity is given a partial HNSW index of its own in that tier
(``WHERE tier = '<tier>' AND tenant = '<tenant>'``, the tier's m /
ef_construction) by the ``placement`` admin job (:func:`place_indexes`), and
recorded in ``pgvector_own_indexes``. The pgvector source reads that table
every :data:`REFRESH_S` and writes such a tenant's name into the text of
its statements for the tier, so that the planner can prove the index's
predicate and take it: the smaller index, holding the tenant's rows only.

The index is the planner's choice, never a condition of the answer: a
statement naming its tenant in its text finds the same rows with or without
the index (walking the shared one otherwise). A process that has not read
the table yet, or a row whose index is gone, costs speed, not results.

Only a tier holding more than its ``exactBelow`` rows of the tenant gets
one (at or under it the rows are compared exactly and no index is walked),
and at most ``postgres.ownIndexesMax`` exist: the tenant tiers of the most
memories get them, since every index on ``memories`` is opened and locked by
each statement planned against the table. The number of indexes grows with
large tenants, not with tenants. The job drops the index of a tenant that
fell below half the threshold or out of the cap; a reindex of the tier
rebuilds the tier's own indexes with its current m / ef_construction, and a
reindex that folds the tier (``decayed``) drops them: a folded tier's
searches walk its fold's index.

A row of a tenant with an index of its own in the row's tier is flagged
``own`` (on write, from ``pgvector_own_indexes``; by the job for the rows
written before), and the tier's shared index leaves it out (``WHERE tier =
... AND NOT own``): a large tenant's writes insert into one graph, not two.
A search that does not name the tenant (its process has not read the table
since the index came) walks the shared index for the unflagged rows and
compares the flagged ones exactly beside it (``memories_own``, a btree of
the flagged rows): slower, the same rows. So no order of flags, indexes
and readers loses a row. The job flags a tenant's rows once its index is
valid and recorded, and clears them before it drops the index.

A tenant about to be bulk loaded gets its indexes reserved first
(:func:`reserve_own_indexes`, the ``import`` admin job): a row in
``pgvector_own_indexes`` with no index behind it yet. Its writes are then
flagged ``own`` and insert into no HNSW graph at all, while its searches
compare those rows exactly (no valid index: the path of a process that has
not read the table). The next ``placement`` job builds the reserved indexes
in one pass each (CREATE INDEX: 0.74 ms a row at 100,000 rows against
8.39 ms a row inserted one by one, ``benchmarks/results/halfvec-100k-s59.md``),
or, for a tenant that ended the import under the threshold, drops the
reservation and moves its rows back into the shared index.

A small tenant's rows (at most the tier's ``exactBelow``) are flagged too,
with no index of their own: its searches never walk one
(:mod:`indexers.postgres.unshared`). The job keeps their flags, and flags
the rows of small tenants written before writes did.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from config import BraidConfig, TierConfig

from .postgres.fold import read_epochs
from .postgres.sql import build_memory, tier_hnsw_ddl
from .postgres.unshared import is_small

__all__ = [
    "REFRESH_S",
    "OwnIndexesFull",
    "drop_own_indexes",
    "own_index_ddl",
    "own_index_name",
    "own_indexes",
    "place_indexes",
    "read_own_indexes",
    "reserve_own_indexes",
    "tenant_sql",
    "tier_builds",
]

log = logging.getLogger("braid.own_index")

#: How often a pgvector source reads ``pgvector_own_indexes``.
REFRESH_S = 10.0

#: ``(tenant, tier)`` -> the tenant's name as a SQL literal (Postgres' own
#: ``quote_literal``; a statement with parameters doubles its ``%``).
OwnIndexes = dict[tuple[str, str], str]


def own_index_name(tier: str, tenant: str) -> str:
    """The name of ``tenant``'s own index in ``tier``: a digest of both, so any
    tenant name fits Postgres' 63 bytes (with a rebuild's ``_rebuild``)."""
    digest = hashlib.sha1(f"{tier}\0{tenant}".encode()).hexdigest()[:24]
    return f"memories_hnsw_own_{digest}"


def own_index_ddl(tier: str, t: TierConfig, tenant_literal: str, name: str, *, concurrently: bool) -> str:
    """The cosine HNSW index of ``tier``'s rows of one tenant (named by
    ``tenant_literal``, a quoted SQL literal), with the tier's m / ef_construction."""
    where = f"tenant = {tenant_literal}"
    return tier_hnsw_ddl(tier, t, name, "embedding vector_cosine_ops", where, concurrently=concurrently)


_READ_SQL = """
    SELECT o.tenant, o.tier, quote_literal(o.tenant) FROM pgvector_own_indexes o
    JOIN pg_index i ON i.indexrelid = to_regclass(o.name) AND i.indisvalid
"""


def tenant_sql(quoted: str | None) -> str:
    """A statement's tenant: the ``%(tenant)s`` parameter, or for a tenant
    with an own index (``quoted``, from :func:`read_own_indexes`) its name in
    the text, its ``%`` doubled for a statement with parameters."""
    return "%(tenant)s" if quoted is None else quoted.replace("%", "%%")


async def read_own_indexes(conn: psycopg.AsyncConnection[Any]) -> OwnIndexes:
    """Every tenant's own indexes that exist and are valid, as ``(tenant,
    tier)`` -> the tenant quoted (a row whose index is gone is left out:
    the next placement job builds it again)."""
    cur = await conn.execute(_READ_SQL)
    return {(tenant, tier): quoted for tenant, tier, quoted in await cur.fetchall()}


async def own_indexes(pool: AsyncConnectionPool, tier: str | None = None) -> list[tuple[str, str, str]]:
    """``(tenant, tier, index name)`` of every own index (of ``tier``), by tenant."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT tenant, tier, name FROM pgvector_own_indexes WHERE %(tier)s::text IS NULL OR tier = %(tier)s"
            " ORDER BY tenant, tier",
            {"tier": tier},
        )
        return [(r[0], r[1], r[2]) for r in await cur.fetchall()]


async def tier_builds(pool: AsyncConnectionPool, tier: str) -> list[tuple[str, str]]:
    """``(index name, the tenant quoted)`` of every own index recorded for
    ``tier``, whether or not the index exists now (what a reindex of the tier builds)."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT name, quote_literal(tenant) FROM pgvector_own_indexes WHERE tier = %s ORDER BY tenant", (tier,)
        )
        return [(name, quoted) for name, quoted in await cur.fetchall()]


async def _build(conn: psycopg.AsyncConnection[Any], ddl: str, name: str, memory_mb: int) -> None:
    """Build ``ddl`` (CONCURRENTLY) as ``name`` with ``memory_mb`` of
    ``maintenance_work_mem``; an invalid ``name`` left by a build cut short goes first."""
    await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
    async with build_memory(conn, memory_mb):
        await conn.execute(ddl)


async def _indexed_tiers(pool: AsyncConnectionPool, cfg: BraidConfig) -> list[str]:
    """The memory tiers whose searches walk a cosine index: those Postgres
    records no fold for (a tier configured ``decayed`` is ranked by
    similarity until a reindex folds it)."""
    async with pool.connection() as conn:
        folds = await read_epochs(conn)
    return [t for t in cfg.memory_tiers if not folds.get(t)]


async def place_indexes(
    pool: AsyncConnectionPool, cfg: BraidConfig, report: Callable[[dict[str, Any]], Awaitable[None]]
) -> None:
    """Build an own index (CONCURRENTLY, one after the other) for every
    tenant with ``postgres.ownIndexAbove`` memories or more, and more than
    the tier's ``exactBelow``, in a memory tier ranked by similarity (no
    fold), reserved ones (:func:`reserve_own_indexes`) included, and drop
    those of tenants now under half of the threshold (or of a tier folded
    meanwhile), reservations too.

    At most ``postgres.ownIndexesMax`` own indexes exist: the tiers of the
    most memories get them, and an index that falls out of that set is
    dropped. Every own index is one more index that every statement planned
    against ``memories`` opens and locks (a peer's per-tenant indexes ran
    Postgres' lock table out at ~2,100 tenants).

    ``report`` gets ``{"pgvector": ...}``: the threshold, the indexes to
    build (``tenant``, ``tier``, ``memories``), ``done`` of ``total``, those
    past the threshold left without one by the cap (``over_cap``), and the
    ones ``dropped``. A build cut short leaves no row: the next job builds
    that index again."""
    threshold = cfg.postgres.own_index_above
    tiers = await _indexed_tiers(pool, cfg)
    if threshold is None:
        await _flag_small(pool, cfg, tiers)
        await report(
            {"pgvector": {"threshold": None, "indexes": [], "done": 0, "total": 0, "over_cap": [], "dropped": []}}
        )
        return
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT tenant, tier, count(*), quote_literal(tenant) FROM memories WHERE tier = ANY(%s)"
            " GROUP BY tenant, tier HAVING count(*) >= %s ORDER BY count(*) DESC, tenant, tier",
            (tiers, (threshold + 1) // 2),
        )
        counts = {(r[0], r[1]): (int(r[2]), r[3]) for r in await cur.fetchall()}
        have = await read_own_indexes(conn)
    recorded = [(tenant, tier) for tenant, tier, _ in await own_indexes(pool)]
    # Past the tier's exactBelow too: at or under it the rows are compared
    # exactly and no index is walked. The largest first, up to the cap; an
    # index kept stays down to half the threshold.
    wanted = {tier: max(threshold, cfg.tiers[tier].exact_below + 1) for tier in tiers}
    eligible = {key: n for key, (n, _) in counts.items() if n >= wanted[key[1]] or key in have}
    chosen = sorted(eligible, key=lambda key: (-eligible[key], key))[: cfg.postgres.own_indexes_max]
    todo = [(key, counts[key][0], counts[key][1]) for key in chosen if key not in have]
    # Recorded ones whose index is gone too (read_own_indexes leaves those out).
    gone = sorted(key for key in recorded if key not in chosen)
    over = [key for key in eligible if key not in chosen and key not in have]
    if over:
        log.warning(
            "%d tenant tiers past postgres.ownIndexAbove get no own index: postgres.ownIndexesMax (%d) is reached",
            len(over),
            cfg.postgres.own_indexes_max,
        )
    await report(
        {
            "pgvector": {
                "threshold": threshold,
                "indexes": [{"tenant": tenant, "tier": tier, "memories": n} for (tenant, tier), n, _ in todo],
                "done": 0,
                "total": len(todo),
                "over_cap": [
                    {"tenant": tenant, "tier": tier, "memories": eligible[(tenant, tier)]} for tenant, tier in over
                ],
            }
        }
    )
    async with pool.connection() as conn:
        for i, ((tenant, tier), n, quoted) in enumerate(todo):
            name = own_index_name(tier, tenant)
            log.info("building the own index of tenant %s in tier %s (%d memories)", tenant, tier, n)
            ddl = own_index_ddl(tier, cfg.tiers[tier], quoted, name, concurrently=True)
            await _build(conn, ddl, name, cfg.postgres.index_build_memory_mb)
            await conn.execute(
                "INSERT INTO pgvector_own_indexes (tenant, tier, name) VALUES (%s, %s, %s)"
                " ON CONFLICT (tenant, tier) DO UPDATE SET name = EXCLUDED.name, built_at = clock_timestamp()",
                (tenant, tier, name),
            )
            await _flag(conn, tenant, tier, own=True)
            await report({"pgvector": {"done": i + 1}})
        for tenant, tier in gone:
            await _drop(conn, tenant, tier, cfg)
        # A row written while the table changed keeps the flag its write
        # read: set right here (a search finds it either way).
        for tenant, tier in chosen:
            if (tenant, tier) in have:
                await _flag(conn, tenant, tier, own=True)
        cur = await conn.execute("SELECT DISTINCT tenant, tier FROM memories WHERE own")
        for tenant, tier in await cur.fetchall():
            if (tenant, tier) not in chosen and not await _small(conn, tenant, tier, cfg):
                await _flag(conn, tenant, tier, own=False)
    await _flag_small(pool, cfg, tiers)
    await report({"pgvector": {"dropped": [{"tenant": tenant, "tier": tier} for tenant, tier in gone]}})


class OwnIndexesFull(RuntimeError):
    """Reserving a tenant's indexes would pass ``postgres.ownIndexesMax``."""


async def reserve_own_indexes(pool: AsyncConnectionPool, cfg: BraidConfig, tenant: str) -> list[str]:
    """Record an own index of ``tenant`` in every memory tier ranked by
    similarity, without building it, and flag the tenant's rows there
    ``own``: its writes from now on insert into no HNSW index, and the next
    :func:`place_indexes` builds the reserved ones in bulk. The tiers
    reserved (those already recorded count as reserved); raises
    :class:`OwnIndexesFull`, reserving nothing, if the recorded indexes
    would pass ``postgres.ownIndexesMax``."""
    tiers = await _indexed_tiers(pool, cfg)
    async with pool.connection() as conn:
        async with conn.transaction():
            # One reservation at a time: the cap is counted and kept together.
            await conn.execute("LOCK TABLE pgvector_own_indexes IN SHARE ROW EXCLUSIVE MODE")
            cur = await conn.execute("SELECT tenant, tier FROM pgvector_own_indexes")
            recorded = {(t, tr) for t, tr in await cur.fetchall()}
            new = [tier for tier in tiers if (tenant, tier) not in recorded]
            cap = cfg.postgres.own_indexes_max
            if len(recorded) + len(new) > cap:
                raise OwnIndexesFull(
                    f"reserving {len(new)} own indexes for tenant {tenant!r} would pass postgres.ownIndexesMax"
                    f" ({cap}; {len(recorded)} recorded): raise it or let a placement job drop unused ones"
                )
            for tier in new:
                await conn.execute(
                    "INSERT INTO pgvector_own_indexes (tenant, tier, name) VALUES (%s, %s, %s)",
                    (tenant, tier, own_index_name(tier, tenant)),
                )
        for tier in tiers:
            await _flag(conn, tenant, tier, own=True)
    return tiers


#: Rows a flag update changes in one statement (each commits: no long row locks).
FLAG_BATCH = 5000


async def _flag(conn: psycopg.AsyncConnection[Any], tenant: str, tier: str, *, own: bool) -> int:
    """Set ``memories.own`` to ``own`` on every row of ``tenant`` in ``tier``,
    :data:`FLAG_BATCH` rows a statement; the number of rows changed.
    Flagged, the rows leave the tier's shared index for the tenant's own
    (the shared index's entries of their old versions go at its next
    vacuum); cleared, they go back in."""
    changed = 0
    while True:
        cur = await conn.execute(
            # Materialized: ``id IN (SELECT ... LIMIT n)`` may run its
            # subquery again and change more than ``n`` rows.
            "WITH picked AS MATERIALIZED ("
            " SELECT id FROM memories WHERE tenant = %(tenant)s AND tier = %(tier)s AND own <> %(own)s"
            " LIMIT %(batch)s)"
            " UPDATE memories m SET own = %(own)s FROM picked WHERE m.tenant = %(tenant)s AND m.id = picked.id",
            {"own": own, "tenant": tenant, "tier": tier, "batch": FLAG_BATCH},
        )
        changed += cur.rowcount
        if cur.rowcount < FLAG_BATCH:
            return changed


async def _flag_small(pool: AsyncConnectionPool, cfg: BraidConfig, tiers: list[str]) -> None:
    """Flag the rows of every tenant holding at most ``exactBelow`` rows in
    one of ``tiers`` (those written before writes flagged them,
    :mod:`indexers.postgres.unshared`): they leave the shared index."""
    async with pool.connection() as conn:
        for tier in tiers:
            cur = await conn.execute(
                "SELECT tenant FROM memories WHERE tier = %s GROUP BY tenant HAVING count(*) <= %s AND bool_or(NOT own)",
                (tier, cfg.tiers[tier].exact_below),
            )
            for (tenant,) in await cur.fetchall():
                await _flag(conn, tenant, tier, own=True)


async def _small(conn: psycopg.AsyncConnection[Any], tenant: str, tier: str, cfg: BraidConfig) -> bool:
    """Whether ``tenant`` holds at most ``exactBelow`` rows in ``tier``: its
    rows stay out of the shared index (:mod:`indexers.postgres.unshared`)."""
    return tier in cfg.tiers and await is_small(conn, tenant, tier, cfg.tiers[tier].exact_below)


async def _drop(conn: psycopg.AsyncConnection[Any], tenant: str, tier: str, cfg: BraidConfig | None) -> None:
    """The row first (writes stop flagging the tenant's rows; searches stop
    naming the index within :data:`REFRESH_S`), then the flags (kept, given
    ``cfg``, on a tenant small enough to be compared exactly: :func:`_small`),
    then the index."""
    cur = await conn.execute(
        "DELETE FROM pgvector_own_indexes WHERE tenant = %s AND tier = %s RETURNING name", (tenant, tier)
    )
    for (name,) in await cur.fetchall():
        await _flag(conn, tenant, tier, own=cfg is not None and await _small(conn, tenant, tier, cfg))
        await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")


async def drop_own_indexes(pool: AsyncConnectionPool, tier: str) -> list[str]:
    """Drop every own index of ``tier`` (a tier being folded); the tenants whose index went."""
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT tenant FROM pgvector_own_indexes WHERE tier = %s ORDER BY tenant", (tier,))
        tenants = [tenant for (tenant,) in await cur.fetchall()]
        for tenant in tenants:
            await _drop(conn, tenant, tier, None)  # a folded tier's fold index holds every row
    return tenants
