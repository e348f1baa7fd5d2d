"""Stored embeddings another model made, read and replaced in batches.

Every memory and entity records the model that made its embedding
(``model``); vector search compares a query vector only with rows of its own
model. The reindex job ``embeddings`` (:mod:`indexers.reindex`) walks the
rows of other models in key order and replaces each batch's vectors with the
current model's. A row changed meanwhile (re-written, deleted) is left as it
now is: the replacement only lands where the model and the text are still
those read. A replaced memory gets its folded vector again (a decayed tier,
:func:`.fold.folds_for_write`), an outbox row for Typesense, and its tenant's
write generation moves (a cached answer of that tenant is not served again).

The statements run as the connecting role, across tenants, like the sweeper's.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from psycopg_pool import AsyncConnectionPool

from .fold import folds_for_write
from .generations import bump_generations
from .models import MemoryInput
from .pool import NOTIFY_CHANNEL
from .sql import vector_param

__all__ = [
    "StaleEntity",
    "StaleMemory",
    "replace_entities",
    "replace_memories",
    "stale_counts",
    "stale_entities",
    "stale_memories",
]


class StaleMemory(NamedTuple):
    """A memory whose embedding another model made: what re-embedding it needs."""

    tenant: str
    id: str
    content: str
    tier: str
    importance: float | None
    created_at: datetime
    model: str


class StaleEntity(NamedTuple):
    """An entity whose embedding another model made."""

    id: int
    tenant: str
    name: str
    summary: str | None
    model: str


async def stale_counts(pool: AsyncConnectionPool, model: str) -> tuple[int, int]:
    """How many memories and entities hold an embedding ``model`` did not make."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT (SELECT count(*) FROM memories WHERE model <> %(m)s),"
            " (SELECT count(*) FROM entities WHERE model <> %(m)s)",
            {"m": model},
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


async def stale_memories(
    pool: AsyncConnectionPool, model: str, after: tuple[str, str] | None, limit: int
) -> list[StaleMemory]:
    """The next ``limit`` memories not made by ``model``, in (tenant, id)
    order after ``after``."""
    where = "model <> %(m)s" + ("" if after is None else " AND (tenant, id) > (%(t)s, %(i)s)")
    params: dict[str, Any] = {"m": model, "limit": limit}
    if after is not None:
        params["t"], params["i"] = after
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT tenant, id, content, tier, importance, created_at, model FROM memories"
            f" WHERE {where} ORDER BY tenant, id LIMIT %(limit)s",
            params,
        )
        return [StaleMemory(*row) for row in await cur.fetchall()]


async def stale_entities(pool: AsyncConnectionPool, model: str, after: int | None, limit: int) -> list[StaleEntity]:
    """The next ``limit`` entities not made by ``model``, in id order after ``after``."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT id, tenant, name, summary, model FROM entities WHERE model <> %s AND id > %s ORDER BY id LIMIT %s",
            (model, -1 if after is None else after, limit),
        )
        return [StaleEntity(*row) for row in await cur.fetchall()]


async def replace_memories(
    pool: AsyncConnectionPool, rows: Sequence[StaleMemory], vectors: Sequence[Sequence[float]], model: str
) -> int:
    """Give ``rows`` the ``vectors`` ``model`` made, in one transaction, where
    each row still holds the model and content it was read with; returns how
    many were replaced."""
    inputs = [
        MemoryInput(
            content=r.content,
            kind="",
            tier=r.tier,
            created_at=r.created_at,
            importance=r.importance,
            embedding=tuple(v),
            model=model,
        )
        for r, v in zip(rows, vectors, strict=True)
    ]
    async with pool.connection() as conn, conn.transaction():
        folds = await folds_for_write(conn, inputs)
        replaced: list[StaleMemory] = []
        for r, m, (folded, epoch) in zip(rows, inputs, folds, strict=True):
            cur = await conn.execute(
                "UPDATE memories SET embedding = %s, model = %s, folded = %s, fold_epoch = %s,"
                " updated_at = clock_timestamp()"
                " WHERE tenant = %s AND id = %s AND model = %s AND content = %s",
                (vector_param(m.embedding or ()), model, folded, epoch, r.tenant, r.id, r.model, r.content),
            )
            if cur.rowcount:
                replaced.append(r)
        if replaced:
            async with conn.cursor() as cur:
                await cur.executemany(
                    "INSERT INTO outbox (tenant, memory_id, op) VALUES (%s, %s, 'upsert')",
                    [(r.tenant, r.id) for r in replaced],
                )
            await conn.execute(f"NOTIFY {NOTIFY_CHANNEL}")
            await bump_generations(conn, (r.tenant for r in replaced))
    return len(replaced)


async def replace_entities(
    pool: AsyncConnectionPool, rows: Sequence[StaleEntity], vectors: Sequence[Sequence[float]], model: str
) -> int:
    """Give ``rows`` the ``vectors`` ``model`` made, where each entity still
    holds the model it was read with; returns how many were replaced."""
    async with pool.connection() as conn, conn.transaction():
        replaced = []
        for r, v in zip(rows, vectors, strict=True):
            cur = await conn.execute(
                "UPDATE entities SET embedding = %s, model = %s, updated_at = clock_timestamp()"
                " WHERE id = %s AND model = %s",
                (vector_param(v), model, r.id, r.model),
            )
            if cur.rowcount:
                replaced.append(r)
        if replaced:
            await bump_generations(conn, (r.tenant for r in replaced))
    return len(replaced)
