"""What is stored, counted per tenant: the reads behind ``GET /admin/stats``.

Three grouped aggregates in one read-only, repeatable-read transaction (so
the counts are of one snapshot): memories by ``(tenant, tier, model)`` with
the superseded and expired ones among them, entities by ``(tenant, model)``,
and pending outbox rows by tenant. Across tenants they run as the connecting
role, as the sweeper and reindex do; for one tenant the transaction is
scoped to it by row-level security (:func:`.pool.scope_to_tenant`).
"""

from __future__ import annotations

from collections import Counter, defaultdict

import msgspec
from psycopg_pool import AsyncConnectionPool

from ..lifecycle import Forgetting
from .pool import scope_to_tenant

__all__ = ["TenantCounts", "tenant_counts"]


class TenantCounts(msgspec.Struct):
    """One tenant's stored rows, counted. Every memory count is of the rows
    stored now: the superseded and the expired (not yet swept) included."""

    tenant: str
    #: tier -> memories.
    by_tier: dict[str, int]
    #: embedding model -> memories whose stored vector it made.
    by_model: dict[str, int]
    #: embedding model -> entities whose stored vector it made.
    entities_by_model: dict[str, int]
    #: Memories a newer version of their ``mem_key`` retired.
    superseded: int
    #: Memories expired now by the config's rule, that no sweep removed yet.
    expired: int
    #: Outbox rows not yet applied to Typesense.
    outbox_pending: int


async def tenant_counts(
    pool: AsyncConnectionPool, forgetting: Forgetting, tenant: str | None = None
) -> list[TenantCounts]:
    """Every tenant with a stored memory, entity or pending outbox row, sorted
    by name; with ``tenant``, that one tenant only, with zero counts if it
    has nothing stored. ``expired`` applies :meth:`Forgetting.sweep_sql`, the
    condition the sweeper removes by, at the transaction's ``now()``."""
    dead, params = forgetting.sweep_sql("m")
    params["tenant"] = tenant
    mine = "TRUE" if tenant is None else "m.tenant = %(tenant)s"
    async with pool.connection() as conn, conn.transaction():
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        if tenant is not None:
            await scope_to_tenant(conn, tenant)
        cur = await conn.execute(
            "SELECT m.tenant, m.tier, m.model, count(*),"
            " count(*) FILTER (WHERE m.superseded_at IS NOT NULL),"
            f" count(*) FILTER (WHERE {dead})"
            f" FROM memories m WHERE {mine} GROUP BY m.tenant, m.tier, m.model",
            params,
        )
        memories = await cur.fetchall()
        cur = await conn.execute(
            f"SELECT m.tenant, m.model, count(*) FROM entities m WHERE {mine} GROUP BY m.tenant, m.model",
            {"tenant": tenant},
        )
        entities = await cur.fetchall()
        cur = await conn.execute(
            f"SELECT m.tenant, count(*) FROM outbox m WHERE m.processed_at IS NULL AND {mine} GROUP BY m.tenant",
            {"tenant": tenant},
        )
        pending = await cur.fetchall()

    tiers: defaultdict[str, Counter[str]] = defaultdict(Counter)
    models: defaultdict[str, Counter[str]] = defaultdict(Counter)
    retired: Counter[str] = Counter()
    expired: Counter[str] = Counter()
    for name, tier, model, total, superseded, dead_now in memories:
        tiers[name][tier] += total
        models[name][model] += total
        retired[name] += superseded
        expired[name] += dead_now
    entity_models: defaultdict[str, Counter[str]] = defaultdict(Counter)
    for name, model, total in entities:
        entity_models[name][model] += total
    outbox = {name: int(total) for name, total in pending}
    names = {*tiers, *entity_models, *outbox, *([] if tenant is None else [tenant])}
    return [
        TenantCounts(
            tenant=name,
            by_tier=_sorted(tiers[name]),
            by_model=_sorted(models[name]),
            entities_by_model=_sorted(entity_models[name]),
            superseded=retired[name],
            expired=expired[name],
            outbox_pending=outbox.get(name, 0),
        )
        for name in sorted(names)
    ]


def _sorted(counts: Counter[str]) -> dict[str, int]:
    return {key: int(n) for key, n in sorted(counts.items())}
