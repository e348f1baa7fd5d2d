"""Per-tenant write generations: the counter a cached recall answer is checked against.

Every transaction that changes what a recall of a tenant can return (a
memory write or delete, a graph edit, a sweep) bumps the tenant's row of
``tenant_generations`` as its last statement, so the bump commits with the
change and the row lock is held only for the commit. A process that read
generation ``g`` before computing an answer may serve that answer while the
generation is still ``g``: any write acknowledged since, by any process on
the database, has moved it. (A sequence or the outbox id would not do:
their values are taken at insert and committed out of order.)
"""

from __future__ import annotations

from collections.abc import Iterable

import psycopg
from psycopg_pool import AsyncConnectionPool

from .pool import on_connection

__all__ = ["BUMP_SQL", "GENERATION", "GENERATION_SQL", "bump_generations", "current_generation", "read_generation"]

#: One tenant's bump (parameter ``tenant``), a statement of its own or a
#: data-modifying ``WITH`` of a transaction's last statement.
BUMP_SQL = (
    "INSERT INTO tenant_generations (tenant, generation) VALUES (%(tenant)s, 1)"
    " ON CONFLICT (tenant) DO UPDATE SET generation = tenant_generations.generation + 1"
)


async def bump_generations(conn: psycopg.AsyncConnection, tenants: Iterable[str]) -> None:
    """Add one to each tenant's generation, in the caller's transaction.

    Rows are locked in tenant order, so transactions bumping several tenants
    (sweeps) cannot deadlock with each other; call it last in a transaction.
    """
    for tenant in sorted(set(tenants)):
        await conn.execute(BUMP_SQL, {"tenant": tenant})


#: One tenant's generation (parameter ``tenant``; 0 before its first write), as
#: an expression: also read beside other columns in one snapshot.
GENERATION = "coalesce((SELECT generation FROM tenant_generations WHERE tenant = %(tenant)s), 0)"

#: One tenant's generation now.
GENERATION_SQL = f"SELECT {GENERATION}"


async def current_generation(pool: AsyncConnectionPool, tenant: str) -> int:
    """The tenant's generation now: one statement, as the connecting role
    (a counter says nothing of the tenant's data). A caller that stops
    waiting leaves it to finish (:func:`.pool.on_connection`)."""

    async def run(conn: psycopg.AsyncConnection) -> int:
        cur = await conn.execute(GENERATION_SQL, {"tenant": tenant})
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    return await on_connection(pool, run)


async def read_generation(pool: AsyncConnectionPool, tenant: str) -> tuple[int, bool]:
    """The tenant's current generation (0 before its first write), and whether
    every change of the tenant has reached the derived indexes (no outbox row
    of it pending): one round trip, as the connecting role (neither says
    anything of the tenant's data); a caller that stops waiting leaves it to finish."""

    async def run(conn: psycopg.AsyncConnection) -> tuple[int, bool]:
        cur = await conn.execute(
            "SELECT (SELECT generation FROM tenant_generations WHERE tenant = %(t)s),"
            " NOT EXISTS (SELECT 1 FROM outbox WHERE processed_at IS NULL AND tenant = %(t)s)",
            {"t": tenant},
        )
        row = await cur.fetchone()
        assert row is not None
        return (0 if row[0] is None else int(row[0])), bool(row[1])

    return await on_connection(pool, run)
