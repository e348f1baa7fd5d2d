"""pgvector: one HNSW collection per tier, each with its own m / ef settings.

Memory tiers are partial HNSW indexes on ``memories`` (``WHERE tier = '<t>'``),
the entity tier is the HNSW index on ``entities``. A search sets
``hnsw.ef_search`` from the tier's config for that query only, and turns on
pgvector 0.8's iterative index scan so that a selective filter (tenant,
session, tags, time) still returns ``limit`` rows when enough rows match.

Whether the index or an exact scan answers is decided in the statement, not
left to the planner: a bounded count of the rows the filter matches (at most
the tier's ``exactBelow`` + 1, read from a btree) picks an exact distance sort
for a small match set, the HNSW index otherwise, whatever the table's
statistics say (why: docs/design.md, "Postgres").
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np
import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from config import BraidConfig, TierConfig, is_safe_name

from .base import Hit, SearchQuery, SourceUnavailable
from .postgres import HIT_COLUMNS, PoolSource, filter_clause, hit_from_row, scope_to_tenant
from .registry import register

__all__ = [
    "PgvectorSource",
    "ensure_indexes",
    "index_name",
    "index_params",
    "nearest_sql",
    "rebuild_index",
    "set_search_params",
]

# Rows an iterative scan may visit before it gives up (pgvector's default is 20000).
MAX_SCAN_TUPLES = 40000


def index_name(tier: str, cfg: BraidConfig) -> str:
    if not is_safe_name(tier):
        raise ValueError(f"invalid tier name {tier!r}")
    if tier == cfg.entity_tier:
        return "entities_hnsw"
    name = f"memories_hnsw_{tier}".replace("-", "_")
    if len(name) >= 63:
        # Postgres cuts identifiers at 63 bytes, which would make the rebuild's
        # `<name>_rebuild` the live index itself; long names get a digest instead.
        name = f"{name[:53]}_{hashlib.sha1(tier.encode()).hexdigest()[:8]}"
    return name


def _index_ddl(tier: str, cfg: BraidConfig, name: str, *, concurrently: bool) -> str:
    t: TierConfig = cfg.tiers[tier]
    conc = "CONCURRENTLY " if concurrently else ""
    with_ = f"WITH (m = {int(t.m)}, ef_construction = {int(t.ef_construction)})"
    if tier == cfg.entity_tier:
        return f"CREATE INDEX {conc}IF NOT EXISTS {name} ON entities USING hnsw (embedding vector_cosine_ops) {with_}"
    return (
        f"CREATE INDEX {conc}IF NOT EXISTS {name} ON memories "
        f"USING hnsw (embedding vector_cosine_ops) {with_} WHERE tier = '{tier}'"
    )


async def ensure_indexes(pool: AsyncConnectionPool, cfg: BraidConfig) -> list[str]:
    """Create each tier's HNSW index if it is missing; return the ones created."""
    created = []
    async with pool.connection() as conn:
        for tier in cfg.tiers:
            name = index_name(tier, cfg)
            cur = await conn.execute("SELECT to_regclass(%s)", (name,))
            row = await cur.fetchone()
            if row is not None and row[0] is not None:
                continue
            await conn.execute("SET maintenance_work_mem = '1GB'")
            try:
                await conn.execute(_index_ddl(tier, cfg, name, concurrently=False))
            finally:
                await conn.execute("RESET maintenance_work_mem")
            created.append(name)
    return created


async def index_params(pool: AsyncConnectionPool, name: str) -> dict[str, int]:
    """The m / ef_construction an existing index was built with."""
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT c.reloptions FROM pg_class c WHERE c.relname = %s", (name,))
        row = await cur.fetchone()
    if row is None:
        raise LookupError(f"no index {name}")
    out = {}
    for opt in row[0] or []:
        key, _, value = opt.partition("=")
        out[key] = int(value)
    return out


async def rebuild_index(
    pool: AsyncConnectionPool,
    cfg: BraidConfig,
    tier: str,
    progress: Callable[[dict[str, object]], None] | None = None,
) -> None:
    """Rebuild a tier's index with its current m / ef_construction, online.

    The new index is built CONCURRENTLY beside the old one, which keeps
    serving searches; then the old one is dropped and the new one renamed.
    """
    name = index_name(tier, cfg)
    tmp = f"{name}_rebuild"
    async with pool.connection() as conn:
        await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {tmp}")
        if progress is not None:
            progress({"tier": tier, "phase": "building", "index": name})
        # HNSW builds are much faster with room for the graph (64 MB: 60% slower at 100k).
        await conn.execute("SET maintenance_work_mem = '1GB'")
        try:
            await conn.execute(_index_ddl(tier, cfg, tmp, concurrently=True))
        finally:
            await conn.execute("RESET maintenance_work_mem")
        await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
        await conn.execute(f"ALTER INDEX {tmp} RENAME TO {name}")
        if progress is not None:
            progress({"tier": tier, "phase": "done", "index": name})


async def set_search_params(conn: psycopg.AsyncConnection, ef_search: int) -> None:
    """Per-transaction settings for the statements of :func:`nearest_sql`.

    ``enable_sort`` off makes the planner take the HNSW index wherever the
    statement allows it (every other path needs a sort); the exact branch
    and the final ordering have no sort-free path, so they still sort.
    No parallel workers: for a big tenant the planner made the exact branch
    a parallel scan, and its workers were launched for every search although
    that branch ran on at most ``exactBelow`` rows or not at all (12-14 ms
    against 2 ms a tier search at 100k rows, docs/design.md).
    """
    await conn.execute(
        "SELECT set_config('hnsw.ef_search', %s, true),"
        " set_config('hnsw.iterative_scan', 'relaxed_order', true),"
        " set_config('hnsw.max_scan_tuples', %s, true),"
        " set_config('enable_sort', 'off', true),"
        " set_config('max_parallel_workers_per_gather', '0', true)",
        (str(int(ef_search)), str(MAX_SCAN_TUPLES)),
    )


def nearest_sql(columns: str, table: str, where: str, embedding: str) -> str:
    """The ``%(limit)s`` rows of ``table`` matching ``where`` nearest to
    ``%(vec)s`` by cosine distance, as ``columns`` plus ``distance``.

    The statement first counts the matching rows, stopping at
    ``%(exact_below)s`` + 1. At most ``exact_below`` rows: they are all
    compared (exact). More: the table's HNSW index is walked. A one-time
    filter runs only the chosen branch. Run it after :func:`set_search_params`
    in the same transaction.
    """
    distance = f"{embedding} <=> %(vec)s"
    return f"""
        WITH small AS MATERIALIZED (
            SELECT count(*) <= %(exact_below)s AS exact
            FROM (SELECT 1 FROM {table} WHERE {where} LIMIT %(exact_below)s + 1) AS matching
        ), nearest AS MATERIALIZED (
            (SELECT {columns}, {distance} AS distance FROM {table}
             WHERE (SELECT exact FROM small) AND {where}
             ORDER BY ({distance}) + 0 LIMIT %(limit)s)
            UNION ALL
            (SELECT {columns}, {distance} AS distance FROM {table}
             WHERE NOT (SELECT exact FROM small) AND {where}
             ORDER BY {distance} LIMIT %(limit)s)
        )
        SELECT * FROM nearest ORDER BY distance, id
    """


class PgvectorSource(PoolSource):
    """Nearest memories by cosine distance, over every memory tier allowed."""

    name = "pgvector"
    needs_vector = True

    async def search(self, query: SearchQuery) -> list[Hit]:
        if query.vector is None:
            return []
        cfg = self._get_config()
        tiers = [t for t in cfg.memory_tiers if query.filters.tiers is None or t in query.filters.tiers]
        limit = max(query.limit, 1)
        vec = np.asarray(query.vector, dtype=np.float32)
        try:
            async with self._pool.connection() as conn:
                rows = await self._search_tiers(conn, cfg, tiers, query, vec, limit)
        except psycopg.Error as exc:
            raise SourceUnavailable(self.name, str(exc).strip() or type(exc).__name__) from exc
        rows.sort(key=lambda r: (r["distance"], r["id"]))
        return [hit_from_row(r, 1.0 - float(r["distance"])) for r in rows[:limit]]

    async def _search_tiers(
        self,
        conn: psycopg.AsyncConnection,
        cfg: BraidConfig,
        tiers: list[str],
        query: SearchQuery,
        vec: np.ndarray,
        limit: int,
    ) -> list[dict[str, Any]]:
        """Every tier's nearest rows, in one round trip: the statements of all
        tiers go out in one pipeline (each tier's ef_search set just before
        its query, inside one transaction) and the results come back together."""
        cursors = []
        async with conn.pipeline(), conn.transaction():
            await scope_to_tenant(conn, query.tenant)
            for tier in tiers:
                where, params = filter_clause(
                    query.filters,
                    min_confidence=query.min_confidence,
                    memory_tiers=cfg.memory_tiers,
                    tier=tier,
                )
                t = cfg.tiers[tier]
                params.update({"tenant": query.tenant, "vec": vec, "limit": limit, "exact_below": t.exact_below})
                # relaxed_order may return the index's rows slightly out of
                # order; the statement sorts them again.
                statement = nearest_sql(HIT_COLUMNS, "memories m", f"m.tenant = %(tenant)s AND {where}", "m.embedding")
                await set_search_params(conn, t.ef_search)
                cur = conn.cursor(row_factory=dict_row)
                await cur.execute(statement, params)
                cursors.append(cur)
        rows: list[dict[str, Any]] = []
        for cur in cursors:
            rows.extend(await cur.fetchall())
            await cur.close()
        return rows


register(PgvectorSource.spec(covers_vectors=True))
