"""Postgres, the source of truth: connection pool, migrations, and every write.

A write is one transaction: the memory rows, their entity links, and an
outbox row per changed memory. Derived indexes (Typesense) are fed from the
outbox by :mod:`indexers.sync`, so nothing acknowledged can be lost to a
Typesense outage. ``NOTIFY braid_outbox`` wakes the sync worker on commit.
"""

from __future__ import annotations

import re
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from typing import Any

import anyio
import msgspec
import numpy as np
import psycopg
from pgvector.psycopg import register_vector_async
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from config.schema import BraidConfig, is_safe_name

from .base import Filters, Hit, MemoryRecord, SourceUnavailable
from .migrations import TENANT_ROLE, migrate

__all__ = [
    "EntityInput",
    "HIT_COLUMNS",
    "MemoryInput",
    "PING_TIMEOUT_S",
    "PoolSource",
    "PostgresStore",
    "RECORD_COLUMNS",
    "RelationInput",
    "TENANT_ROLE",
    "filter_clause",
    "hit_from_row",
    "name_candidates",
    "normalize_name",
    "record_from_row",
    "open_pool",
    "scope_to_tenant",
    "tenant_transaction",
]

NOTIFY_CHANNEL = "braid_outbox"

#: How long a health check waits on Postgres.
PING_TIMEOUT_S = 2.0


def normalize_name(name: str) -> str:
    """Entity names are unique per tenant, case- and space-insensitively."""
    return " ".join(name.split()).casefold()


class MemoryInput(msgspec.Struct, frozen=True):
    """A validated memory to write.

    ``embedding`` is ``None`` until the engine embeds the content; the store
    only accepts inputs whose embedding and ``model`` are filled in.
    """

    content: str
    kind: str
    tier: str
    created_at: datetime
    id: str | None = None
    session_id: str | None = None
    tags: tuple[str, ...] = ()
    importance: float | None = None
    confidence: float = 1.0
    speaker: str | None = None
    context: str | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    entities: tuple[str, ...] = ()
    embedding: tuple[float, ...] | None = None
    model: str | None = None


class EntityInput(msgspec.Struct, frozen=True):
    name: str
    embedding: tuple[float, ...]
    model: str
    type: str | None = None
    summary: str | None = None


class RelationInput(msgspec.Struct, frozen=True):
    source: str
    relation: str
    target: str
    weight: float = 1.0
    valid_from: datetime | None = None
    valid_to: datetime | None = None


async def _configure(conn: psycopg.AsyncConnection) -> None:
    await register_vector_async(conn)
    # Timestamps are read back in UTC whatever the server's TimeZone: in another
    # zone, a valid instant near year 1 or 9999 would be out of Python's range.
    await conn.execute("SET TIME ZONE 'UTC'")


async def open_pool(dsn: str, *, dim: int, min_size: int, max_size: int) -> AsyncConnectionPool:
    """Migrate the schema, then open a pool whose connections know `vector`."""
    try:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await migrate(conn, dim=dim)
    except psycopg.OperationalError as exc:
        raise SourceUnavailable("postgres", str(exc).strip()) from exc
    pool = AsyncConnectionPool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        open=False,
        configure=_configure,
        kwargs={"autocommit": True},
        name="braid",
        # How long a request waits for a connection before it fails with 503.
        timeout=5.0,
    )
    await pool.open(wait=True, timeout=30)
    return pool


def _vec(values: Sequence[float]) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


_WORD_RE = re.compile(r"\w+", re.UNICODE)
#: Stripped from the ends of a whitespace token ("Node.js," -> "Node.js"); not `+` or `#`.
_EDGE_PUNCT = ".,;:!?\"'`()[]{}<>«»“”‘’"


def name_candidates(text: str, *, max_words: int = 4) -> list[str]:
    """Normalised 1..max_words-grams of ``text``: the names it could mention.

    Grams are taken over its words (``\\w+``) and over its whitespace tokens
    trimmed of surrounding punctuation, so names with inner punctuation
    (``Node.js``, ``C++``) are found as well.
    """
    tokens = (t.strip(_EDGE_PUNCT) for t in text.split())
    grams: set[str] = set()
    for words in (
        [w.casefold() for w in _WORD_RE.findall(text)],
        [t.casefold() for t in tokens if t],
    ):
        grams.update(
            " ".join(words[i : i + n])
            for n in range(1, max_words + 1)
            for i in range(len(words) - n + 1)
        )
    return sorted(grams)


async def _count_mentions(conn: psycopg.AsyncConnection, delta: Counter[int]) -> None:
    """Apply net mention-count changes (entity id -> +/-n) in the caller's transaction.

    The rows are locked in id order first, so concurrent writers touching
    overlapping entities queue instead of deadlocking. ``FOR NO KEY UPDATE``
    (the lock the UPDATE takes anyway) does not conflict with the key-share
    locks that the writers' mention inserts hold on the same entities.
    """
    changes = sorted((eid, n) for eid, n in delta.items() if n)
    if not changes:
        return
    eids = [eid for eid, _ in changes]
    await conn.execute(
        "SELECT id FROM entities WHERE id = ANY(%s) ORDER BY id FOR NO KEY UPDATE", (eids,)
    )
    await conn.execute(
        "UPDATE entities SET mention_count = mention_count + d.n"
        " FROM unnest(%s::bigint[], %s::bigint[]) AS d(id, n) WHERE entities.id = d.id",
        (eids, [n for _, n in changes]),
    )


async def scope_to_tenant(conn: psycopg.AsyncConnection, tenant: str) -> None:
    """Run the rest of the current transaction as :data:`TENANT_ROLE` for ``tenant``.

    Row-level security (migration v5) then lets the transaction see and write
    ``tenant``'s rows only: a statement that forgot ``tenant = %s`` still sees
    one tenant. The connecting role is not restricted; the outbox worker and
    reindex, which work across tenants, run as it. Both settings are transaction-local: they end with the transaction, so a
    connection goes back to the pool unscoped even after an error.
    """
    await conn.execute(
        "SELECT set_config('role', %s, true), set_config('braid.tenant', %s, true)",
        (TENANT_ROLE, tenant),
    )


@asynccontextmanager
async def tenant_transaction(
    pool: AsyncConnectionPool, tenant: str
) -> AsyncIterator[psycopg.AsyncConnection]:
    """A pooled connection inside a transaction scoped to ``tenant``."""
    async with pool.connection() as conn, conn.transaction():
        await scope_to_tenant(conn, tenant)
        yield conn


class PoolSource:
    """Base of the sources that read Postgres: a shared pool and the live config."""

    name: str

    def __init__(self, pool: AsyncConnectionPool, get_config: Callable[[], BraidConfig]) -> None:
        self._pool = pool
        self._get_config = get_config

    async def aclose(self) -> None:
        """Nothing to release: the pool belongs to the runtime."""


class PostgresStore:
    """Write side of the source of truth, and the reads derived indexes need."""

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool

    async def aclose(self) -> None:
        await self.pool.close()

    async def ping(self, timeout: float = PING_TIMEOUT_S) -> bool:
        """Whether Postgres answers ``SELECT 1`` within ``timeout`` seconds,
        the wait for a connection included (a stalled server accepts
        connections and never answers)."""
        try:
            with anyio.fail_after(timeout):
                async with self.pool.connection() as conn:
                    await conn.execute("SELECT 1")
            return True
        except Exception:  # any failure means "not up"; the reason is logged by the caller
            return False

    # --- memories -----------------------------------------------------------

    async def existing_entities(self, tenant: str, names: Sequence[str]) -> set[str]:
        """The normalised names among ``names`` that already exist."""
        if not names:
            return set()
        async with tenant_transaction(self.pool, tenant) as conn:
            cur = await conn.execute(
                "SELECT name_norm FROM entities WHERE tenant = %s AND name_norm = ANY(%s)",
                (tenant, [normalize_name(n) for n in names]),
            )
            return {row[0] for row in await cur.fetchall()}

    async def write_memories(
        self,
        tenant: str,
        memories: Sequence[MemoryInput],
        new_entities: Sequence[EntityInput] = (),
    ) -> list[str]:
        """Upsert memories, their mentions and outbox rows in one transaction.

        ``new_entities`` are entities named by the memories that do not exist
        yet, with their embeddings computed by the caller.
        """
        if any(m.embedding is None or m.model is None for m in memories):
            raise ValueError("every memory must carry its embedding and model")
        ids = [m.id or str(uuid.uuid4()) for m in memories]
        async with tenant_transaction(self.pool, tenant) as conn:
            if new_entities:
                await self._upsert_entities(conn, tenant, new_entities, overwrite=False)
            async with conn.cursor() as cur:
                await cur.executemany(
                    """
                    INSERT INTO memories (tenant, id, content, kind, tier, session_id, tags,
                        importance, confidence, speaker, context, metadata, created_at,
                        embedding, model)
                    VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
                    ON CONFLICT (tenant, id) DO UPDATE SET
                        content = EXCLUDED.content, kind = EXCLUDED.kind, tier = EXCLUDED.tier,
                        session_id = EXCLUDED.session_id, tags = EXCLUDED.tags,
                        importance = EXCLUDED.importance, confidence = EXCLUDED.confidence,
                        speaker = EXCLUDED.speaker, context = EXCLUDED.context,
                        metadata = EXCLUDED.metadata, created_at = EXCLUDED.created_at,
                        embedding = EXCLUDED.embedding, model = EXCLUDED.model,
                        updated_at = clock_timestamp()
                    """,
                    [
                        (
                            tenant, mid, m.content, m.kind, m.tier, m.session_id, list(m.tags),
                            m.importance, m.confidence, m.speaker, m.context,
                            Jsonb(m.metadata), m.created_at,
                            _vec(m.embedding or ()), m.model,
                        )
                        for mid, m in zip(ids, memories, strict=True)
                    ],
                )
                speakers = sorted({m.speaker for m in memories if m.speaker})
                if speakers:
                    await cur.execute(
                        "INSERT INTO speakers (tenant, name) SELECT %s, unnest(%s::text[])"
                        " ON CONFLICT DO NOTHING",
                        (tenant, speakers),
                    )
                # Mentions: the names given explicitly plus known entity names in the text.
                await cur.execute(
                    "DELETE FROM mentions WHERE tenant = %s AND memory_id = ANY(%s)"
                    " RETURNING entity_id",
                    (tenant, ids),
                )
                delta: Counter[int] = Counter()
                delta.subtract(eid for (eid,) in await cur.fetchall())
                links: list[tuple[str, str]] = []
                for mid, m in zip(ids, memories, strict=True):
                    names = {normalize_name(n) for n in m.entities}
                    names.update(name_candidates(m.content))
                    links.extend((mid, n) for n in names)
                if links:
                    # created_at is the memory's (copied for the newest-first
                    # fetch); the memory row is locked by the upsert above.
                    await cur.execute(
                        """
                        INSERT INTO mentions (tenant, memory_id, entity_id, created_at)
                        SELECT %(tenant)s, l.memory_id, e.id, m.created_at
                        FROM unnest(%(mids)s::text[], %(names)s::text[]) AS l(memory_id, name_norm)
                        JOIN entities e ON e.tenant = %(tenant)s AND e.name_norm = l.name_norm
                        JOIN memories m ON m.tenant = %(tenant)s AND m.id = l.memory_id
                        ON CONFLICT DO NOTHING
                        RETURNING entity_id
                        """,
                        {
                            "tenant": tenant,
                            "mids": [mid for mid, _ in links],
                            "names": [n for _, n in links],
                        },
                    )
                    delta.update(eid for (eid,) in await cur.fetchall())
                await _count_mentions(conn, delta)
                await cur.execute(
                    """
                    INSERT INTO outbox (tenant, memory_id, op)
                    SELECT %s, unnest(%s::text[]), 'upsert'
                    """,
                    (tenant, ids),
                )
                await cur.execute(f"NOTIFY {NOTIFY_CHANNEL}")
        return ids

    async def delete_memory(self, tenant: str, memory_id: str) -> bool:
        async with tenant_transaction(self.pool, tenant) as conn:
            # Lock the memory first: a concurrent write of it then either
            # finished (its mentions are seen below) or waits for us.
            cur = await conn.execute(
                "SELECT 1 FROM memories WHERE tenant = %s AND id = %s FOR UPDATE",
                (tenant, memory_id),
            )
            if await cur.fetchone() is None:
                return False
            cur = await conn.execute(
                "DELETE FROM mentions WHERE tenant = %s AND memory_id = %s RETURNING entity_id",
                (tenant, memory_id),
            )
            delta: Counter[int] = Counter()
            delta.subtract(eid for (eid,) in await cur.fetchall())
            await _count_mentions(conn, delta)
            await conn.execute(
                "DELETE FROM memories WHERE tenant = %s AND id = %s", (tenant, memory_id)
            )
            await conn.execute(
                "INSERT INTO outbox (tenant, memory_id, op) VALUES (%s, %s, 'delete')",
                (tenant, memory_id),
            )
            await conn.execute(f"NOTIFY {NOTIFY_CHANNEL}")
        return True

    async def tiers_in_use(self, tiers: Sequence[str]) -> list[str]:
        """Those of ``tiers`` that hold at least one memory, of any tenant."""
        if not tiers:
            return []
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT t FROM unnest(%s::text[]) AS t"
                " WHERE EXISTS (SELECT 1 FROM memories m WHERE m.tier = t) ORDER BY t",
                (list(tiers),),
            )
            return [row[0] for row in await cur.fetchall()]

    async def speakers(self, tenant: str) -> list[str]:
        """Every speaker name the tenant's memories have had."""
        async with tenant_transaction(self.pool, tenant) as conn:
            cur = await conn.execute("SELECT name FROM speakers WHERE tenant = %s", (tenant,))
            return [row[0] for row in await cur.fetchall()]

    async def fetch_records(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], MemoryRecord]:
        """Current rows for (tenant, id) pairs; missing ones are absent."""
        if not keys:
            return {}
        async with self.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(
                f"""
                SELECT {_RECORD_COLUMNS}
                FROM memories m
                JOIN unnest(%s::text[], %s::text[]) AS k(tenant, id)
                  ON m.tenant = k.tenant AND m.id = k.id
                """,
                ([t for t, _ in keys], [i for _, i in keys]),
            )
            rows = await cur.fetchall()
        return {(r["tenant"], r["id"]): record_from_row(r) for r in rows}

    # --- graph --------------------------------------------------------------

    async def _upsert_entities(
        self,
        conn: psycopg.AsyncConnection,
        tenant: str,
        entities: Sequence[EntityInput],
        *,
        overwrite: bool,
    ) -> None:
        conflict = (
            """DO UPDATE SET
                   type = coalesce(EXCLUDED.type, entities.type),
                   summary = coalesce(EXCLUDED.summary, entities.summary),
                   embedding = EXCLUDED.embedding, model = EXCLUDED.model,
                   updated_at = clock_timestamp()"""
            if overwrite
            else "DO NOTHING"
        )
        async with conn.cursor() as cur:
            await cur.executemany(
                f"""
                INSERT INTO entities (tenant, name, name_norm, type, summary, embedding, model)
                VALUES (%s, %s, %s, %s, %s, %s, %s)
                ON CONFLICT (tenant, name_norm) {conflict}
                """,
                [
                    (
                        tenant, " ".join(e.name.split()), normalize_name(e.name), e.type,
                        e.summary, _vec(e.embedding), e.model,
                    )
                    # In name order (stable: a repeated name's last row still
                    # wins), so writers creating the same entities cannot
                    # wait on each other's inserts in opposite orders.
                    for e in sorted(entities, key=lambda e: normalize_name(e.name))
                ],
            )

    async def write_graph(
        self,
        tenant: str,
        entities: Sequence[EntityInput],
        relations: Sequence[RelationInput],
    ) -> dict[str, int]:
        """Upsert entities, then relations between entities by name, in one transaction.

        Every name a relation uses must be in ``entities`` or already exist;
        the caller makes sure of that (it embeds the missing names).
        """
        async with tenant_transaction(self.pool, tenant) as conn:
            if entities:
                await self._upsert_entities(conn, tenant, entities, overwrite=True)
            if relations:
                async with conn.cursor() as cur:
                    await cur.executemany(
                        """
                        INSERT INTO relations (tenant, source_id, relation, target_id, weight,
                                               valid_from, valid_to)
                        SELECT %(tenant)s, s.id, %(relation)s, t.id, %(weight)s,
                               %(valid_from)s, %(valid_to)s
                        FROM entities s, entities t
                        WHERE s.tenant = %(tenant)s AND s.name_norm = %(source)s
                          AND t.tenant = %(tenant)s AND t.name_norm = %(target)s
                        ON CONFLICT (tenant, source_id, relation, target_id,
                                     coalesce(valid_from, '-infinity'))
                        DO UPDATE SET weight = EXCLUDED.weight, valid_to = EXCLUDED.valid_to
                        """,
                        [
                            {
                                "tenant": tenant,
                                "relation": r.relation,
                                "weight": r.weight,
                                "valid_from": r.valid_from,
                                "valid_to": r.valid_to,
                                "source": normalize_name(r.source),
                                "target": normalize_name(r.target),
                            }
                            for r in relations
                        ],
                    )
        return {"entities": len(entities), "relations": len(relations)}


    async def delete_relations(
        self, tenant: str, source: str, target: str, relation: str | None = None
    ) -> int:
        """Delete the relations from ``source`` to ``target`` (of one ``relation``
        name, or all of them); return how many went. Entities stay."""
        async with tenant_transaction(self.pool, tenant) as conn:
            cur = await conn.execute(
                """
                DELETE FROM relations r USING entities s, entities t
                WHERE r.tenant = %(tenant)s AND s.tenant = %(tenant)s AND t.tenant = %(tenant)s
                  AND s.name_norm = %(source)s AND t.name_norm = %(target)s
                  AND r.source_id = s.id AND r.target_id = t.id
                  AND (%(relation)s::text IS NULL OR r.relation = %(relation)s::text)
                """,
                {
                    "tenant": tenant,
                    "source": normalize_name(source),
                    "target": normalize_name(target),
                    "relation": relation,
                },
            )
            return cur.rowcount

    async def delete_entity(self, tenant: str, name: str) -> int | None:
        """Delete an entity with its relations and mentions (memories stay);
        return how many relations went with it, or None if there is no such entity."""
        async with tenant_transaction(self.pool, tenant) as conn:
            cur = await conn.execute(
                "SELECT id FROM entities WHERE tenant = %s AND name_norm = %s FOR UPDATE",
                (tenant, normalize_name(name)),
            )
            row = await cur.fetchone()
            if row is None:
                return None
            cur = await conn.execute(
                "DELETE FROM relations WHERE tenant = %(tenant)s"
                " AND (source_id = %(id)s OR target_id = %(id)s)",
                {"tenant": tenant, "id": row[0]},
            )
            relations = cur.rowcount
            # Mentions go by cascade; the entity's mention_count goes with it.
            await conn.execute("DELETE FROM entities WHERE tenant = %s AND id = %s", (tenant, row[0]))
            return relations


_RECORD_COLUMNS = (
    "m.tenant, m.id, m.content, m.kind, m.tier, m.session_id, m.tags, m.importance, "
    "m.confidence, m.speaker, m.context, m.created_at, m.embedding, m.model"
)

#: The memory columns :func:`hit_from_row` reads.
HIT_COLUMNS = "m.id, m.content, m.kind, m.tier, m.created_at, m.confidence, m.speaker"


def hit_from_row(row: dict[str, Any], score: float) -> Hit:
    """A memory row (:data:`HIT_COLUMNS`) as a search hit."""
    return Hit(
        id=row["id"],
        content=row["content"],
        kind=row["kind"],
        tier=row["tier"],
        created_at=row["created_at"].astimezone(timezone.utc),
        confidence=float(row["confidence"]),
        score=score,
        speaker=row["speaker"],
    )


def record_from_row(row: dict[str, Any]) -> MemoryRecord:
    emb = row["embedding"]
    if hasattr(emb, "to_list"):  # pgvector.Vector from a binary-format fetch
        emb = emb.to_list()
    return MemoryRecord(
        id=row["id"],
        tenant=row["tenant"],
        content=row["content"],
        kind=row["kind"],
        tier=row["tier"],
        created_at=row["created_at"].astimezone(timezone.utc),
        confidence=float(row["confidence"]),
        importance=None if row["importance"] is None else float(row["importance"]),
        session_id=row["session_id"],
        tags=tuple(row["tags"] or ()),
        speaker=row["speaker"],
        context=row["context"],
        embedding=None if emb is None else tuple(float(x) for x in emb),
        model=row["model"],
    )


RECORD_COLUMNS = _RECORD_COLUMNS


def filter_clause(
    filters: Filters,
    *,
    min_confidence: float,
    memory_tiers: Sequence[str],
    alias: str = "m",
    tier: str | None = None,
) -> tuple[str, dict[str, Any]]:
    """SQL conditions (joined by AND, never empty) and their named parameters.

    Only values travel as parameters; the SQL text is fixed, so no filter
    value can change the query's shape. The tenant condition is the caller's.
    With ``tier`` the condition names that one tier as a literal, so the
    planner can use the tier's partial HNSW index (tier names are validated
    identifiers, see ``config.NAME_PATTERN``).
    """
    a = alias
    conds = [f"{a}.confidence >= %(f_min_conf)s"]
    params: dict[str, Any] = {"f_min_conf": min_confidence}
    if tier is not None:
        if not is_safe_name(tier):
            raise ValueError(f"invalid tier name {tier!r}")
        conds.append(f"{a}.tier = '{tier}'")
    else:
        conds.append(f"{a}.tier = ANY(%(f_tiers)s)")
        params["f_tiers"] = [t for t in memory_tiers if filters.tiers is None or t in filters.tiers]
    if filters.session_id is not None:
        conds.append(f"{a}.session_id = %(f_session)s")
        params["f_session"] = filters.session_id
    if filters.tags:
        conds.append(f"{a}.tags && %(f_tags)s::text[]")
        params["f_tags"] = list(filters.tags)
    if filters.kinds:
        conds.append(f"{a}.kind = ANY(%(f_kinds)s)")
        params["f_kinds"] = list(filters.kinds)
    if filters.created_after is not None:
        conds.append(f"{a}.created_at >= %(f_after)s")
        params["f_after"] = filters.created_after
    if filters.created_before is not None:
        conds.append(f"{a}.created_at <= %(f_before)s")
        params["f_before"] = filters.created_before
    return " AND ".join(conds), params
