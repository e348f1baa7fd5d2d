"""The write side of the source of truth, and the reads derived indexes need.

A write is one transaction: the memory rows, their entity links, and an
outbox row per changed memory. Derived indexes (Typesense) are fed from the
outbox by :mod:`indexers.sync`, so nothing acknowledged can be lost to a
Typesense outage. ``NOTIFY braid_outbox`` wakes the sync worker on commit.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime

import anyio
import msgspec
import numpy as np
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from ..base import Filters, Hit, MemoryRecord
from ..extraction import Extraction
from ..lifecycle import Forgetting
from .arrays import TextArray
from .derived import SupportRow, count_mentions, count_support, link_mentions, replace_support, unlink
from .fold import folds_for_write
from .generations import BUMP_SQL, bump_generations
from .graph_writes import GraphWrites, upsert_entities
from .lifecycle import Deleted, Written, lock_keys, lock_memory, restore_newest, supersede
from .models import EntityInput, MemoryInput
from .names import name_candidates, normalize_name
from .pool import NOTIFY_CHANNEL, PING_TIMEOUT_S, Read, tenant_reads, tenant_transaction
from .sql import (
    HIT_COLUMNS,
    RECORD_COLUMNS,
    RECORD_COLUMNS_NO_EMBEDDING,
    by_ids_sql,
    filter_clause,
    hit_from_row,
    lifecycle_clause,
    record_from_row,
    vector_param,
)
from .unshared import flag_rows, move_rows

__all__ = ["PostgresStore"]


#: How long ``relation_tombstones`` rows are kept: twice as long as a
#: process's copy of a tenant's relations may go without reading its changes
#: (``indexers.graph_cache.STALE_S``).
TOMBSTONE_KEEP = "1 hour"

log = logging.getLogger("braid.postgres")

#: A memory write's last statement: the changed memories' outbox rows, the
#: sync worker's wake-up (``pg_notify`` is delivered at commit, as ``NOTIFY``)
#: and the tenant's generation bump (:mod:`.generations`), the one row lock
#: every writer of the tenant takes, held only for the commit. (A
#: data-modifying ``WITH`` runs to completion whether or not it is read.)
_CLOSE_WRITE = f"""
    WITH queued AS (
        INSERT INTO outbox (tenant, memory_id, op) SELECT %(tenant)s, unnest(%(ids)s::text[]), 'upsert'
    ), bumped AS ({BUMP_SQL})
    SELECT pg_notify('{NOTIFY_CHANNEL}', '')
"""


class PostgresStore(GraphWrites):
    """Write side of the source of truth, and the reads derived indexes need.

    The graph edits (entities, relations) come from :class:`.graph_writes.GraphWrites`.
    """

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool
        self._ping_failing = False

    async def aclose(self) -> None:
        await self.pool.close()

    async def ping(self, timeout: float = PING_TIMEOUT_S) -> bool:
        """Whether Postgres answers ``SELECT 1`` within ``timeout`` seconds,
        the wait for a connection included (a stalled server accepts
        connections and never answers).

        Any failure means "not up". The first failure of a streak is logged
        at WARNING with its reason, the next success at INFO; the failures
        in between are not logged again.
        """
        try:
            with anyio.fail_after(timeout):
                async with self.pool.connection() as conn:
                    await conn.execute("SELECT 1")
        except Exception as exc:
            if not self._ping_failing:
                reason = (
                    f"no answer within {timeout:g} s"
                    if isinstance(exc, TimeoutError)
                    else str(exc).strip() or type(exc).__name__
                )
                log.warning("postgres ping failed: %s", reason)
            self._ping_failing = True
            return False
        if self._ping_failing:
            log.info("postgres answers pings again")
        self._ping_failing = False
        return True

    async def existing_entities(self, tenant: str, names: Sequence[str]) -> set[str]:
        """The normalised names among ``names`` that already exist: one round trip."""
        if not names:
            return set()
        (rows,) = await tenant_reads(
            self.pool,
            tenant,
            [
                Read(
                    "SELECT name_norm FROM entities WHERE tenant = %s AND name_norm = ANY(%s)",
                    (tenant, [normalize_name(n) for n in names]),
                )
            ],
        )
        return {row[0] for row in rows}

    async def write_memories(
        self,
        tenant: str,
        memories: Sequence[MemoryInput],
        new_entities: Sequence[EntityInput] = (),
        extracted: Sequence[Extraction] | None = None,
        exact_below: Mapping[str, int] | None = None,
        entity_exact_below: int | None = None,
    ) -> Written:
        """Upsert memories, their mentions and outbox rows in one transaction.

        ``new_entities`` are entities named by the memories that do not exist
        yet, with their embeddings computed by the caller. ``extracted``
        (aligned with ``memories``) adds what was extracted from each text:
        its entities are linked like named ones, and the memory supports its
        relations (:mod:`.derived`), replacing what it supported before. A memory with a
        ``mem_key`` retires its key's current memory, or is retired at once
        if that one is newer (:func:`.lifecycle.supersede`); every memory
        whose lifecycle changed gets an outbox row too.

        ``exact_below`` (each memory tier's ``exactBelow``): the rows of a
        tenant that holds at most that many in their tier stay out of the
        tier's shared HNSW index, and a tenant past it has its earlier rows
        moved in, a batch a write (:mod:`.unshared`); None: only the rows of
        a tenant with an index of its own stay out. ``entity_exact_below``:
        the same for ``new_entities`` and the entity tier (None: they go in).
        """
        if any(m.embedding is None or m.model is None for m in memories):
            raise ValueError("every memory must carry its embedding and model")
        ids = [m.id or str(uuid.uuid4()) for m in memories]
        async with tenant_transaction(self.pool, tenant) as conn:
            # Each key's lock first, in one order: writers of a key queue here.
            await lock_keys(conn, tenant, [m.mem_key for m in memories if m.mem_key is not None])
            if any(m.stamped and m.mem_key is not None for m in memories):
                # Dated now, under the key's lock: in commit order (Postgres' clock, one for every replica).
                row = await (await conn.execute("SELECT clock_timestamp()")).fetchone()
                assert row is not None
                stamp = row[0]
                memories = [
                    msgspec.structs.replace(m, created_at=stamp) if m.stamped and m.mem_key is not None else m
                    for m in memories
                ]
            if new_entities:
                await upsert_entities(conn, tenant, new_entities, overwrite=False, exact_below=entity_exact_below)
            # A decayed tier's folded vector, with its tier's newest epoch (.fold).
            folds = await folds_for_write(conn, memories)
            flags, move = await flag_rows(conn, tenant, memories, [e for _, e in folds], exact_below)
            async with conn.cursor() as cur:
                await cur.executemany(
                    """
                    INSERT INTO memories (tenant, id, content, kind, tier, session_id, tags,
                        importance, confidence, speaker, context, metadata, created_at,
                        embedding, model, folded, fold_epoch, mem_key, superseded_at, superseded_by,
                        expires_at, own)
                    VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, NULL, NULL, %s, %s)
                    ON CONFLICT (tenant, id) DO UPDATE SET
                        content = EXCLUDED.content, kind = EXCLUDED.kind, tier = EXCLUDED.tier,
                        session_id = EXCLUDED.session_id, tags = EXCLUDED.tags,
                        importance = EXCLUDED.importance, confidence = EXCLUDED.confidence,
                        speaker = EXCLUDED.speaker, context = EXCLUDED.context,
                        metadata = EXCLUDED.metadata, created_at = EXCLUDED.created_at,
                        embedding = EXCLUDED.embedding, model = EXCLUDED.model,
                        folded = EXCLUDED.folded, fold_epoch = EXCLUDED.fold_epoch,
                        mem_key = EXCLUDED.mem_key, superseded_at = NULL, superseded_by = NULL,
                        expires_at = EXCLUDED.expires_at, own = EXCLUDED.own,
                        updated_at = clock_timestamp()
                    """,
                    [
                        (
                            tenant,
                            mid,
                            m.content,
                            m.kind,
                            m.tier,
                            m.session_id,
                            list(m.tags),
                            m.importance,
                            m.confidence,
                            m.speaker,
                            m.context,
                            Jsonb(m.metadata),
                            m.created_at,
                            vector_param(m.embedding or ()),
                            m.model,
                            folded,
                            fold_epoch,
                            m.mem_key,
                            m.expires_at,
                            own,
                        )
                        for mid, m, (folded, fold_epoch), own in zip(ids, memories, folds, flags, strict=True)
                    ],
                )
                if move:
                    await move_rows(conn, tenant, move)
                speakers = sorted({m.speaker for m in memories if m.speaker})
                if speakers:
                    await cur.execute(
                        "INSERT INTO speakers (tenant, name) SELECT %s, unnest(%s::text[]) ON CONFLICT DO NOTHING",
                        (tenant, speakers),
                    )
                # Mentions: the names given explicitly, the extracted ones, and
                # known entity names in the text.
                delta, dropped = await unlink(conn, tenant, ids)
                links: list[tuple[str, str]] = []
                support: list[SupportRow] = []
                found: Sequence[Extraction | None] = [None] * len(ids) if extracted is None else extracted
                for mid, m, x in zip(ids, memories, found, strict=True):
                    names = {normalize_name(n) for n in m.entities}
                    names.update(name_candidates(m.content))
                    if x is not None:
                        names.update(normalize_name(e.name) for e in x.entities)
                        support.extend(
                            (mid, normalize_name(r.source), r.relation, normalize_name(r.target)) for r in x.relations
                        )
                    links.extend((mid, n) for n in names)
                await link_mentions(conn, tenant, links, delta)
                # A rewritten memory supports what its new text states, and no more.
                await replace_support(conn, tenant, ids, support, dropped=dropped)
                superseded, touched = await supersede(conn, tenant, ids, memories)
                # Supersessions included: a cached answer never outlives a retirement.
                await cur.execute(_CLOSE_WRITE, {"tenant": tenant, "ids": list(dict.fromkeys([*ids, *touched]))})
        return Written(ids=ids, superseded=superseded)

    async def apply_extraction(
        self,
        tenant: str,
        ids: Sequence[str],
        extracted: Sequence[Extraction],
        new_entities: Sequence[EntityInput] = (),
        entity_exact_below: int | None = None,
    ) -> None:
        """Re-extraction of stored memories (``POST /admin/reindex {"target":
        "graph"}``), one transaction: the extracted entities are created
        (``new_entities``, embedded by the caller) and linked, links made
        before (named by a client, found in the text) stay, and each memory
        supports exactly the relations extracted now. A memory deleted
        meanwhile is skipped. ``entity_exact_below``: as :meth:`write_memories`'."""
        async with tenant_transaction(self.pool, tenant) as conn:
            if new_entities:
                await upsert_entities(conn, tenant, new_entities, overwrite=False, exact_below=entity_exact_below)
            links = [(mid, normalize_name(e.name)) for mid, x in zip(ids, extracted, strict=True) for e in x.entities]
            await link_mentions(conn, tenant, links)
            support = [
                (mid, normalize_name(r.source), r.relation, normalize_name(r.target))
                for mid, x in zip(ids, extracted, strict=True)
                for r in x.relations
            ]
            await replace_support(conn, tenant, ids, support)
            await bump_generations(conn, [tenant])

    async def delete_memory(self, tenant: str, memory_id: str, *, restore_previous: bool = False) -> Deleted | None:
        """Delete a memory for good; ``None`` if the tenant has none of that id.

        The memories it retired stay retired, unless ``restore_previous`` and
        it was its key's current memory: then the newest retired version of
        the key becomes current again (and reaches Typesense by the outbox).
        """
        async with tenant_transaction(self.pool, tenant) as conn:
            # The key's lock before the row's, as a write takes them.
            row = await lock_memory(conn, tenant, memory_id)
            if row is None:
                return None
            mem_key, current = row
            mentions, support = await unlink(conn, tenant, [memory_id])
            await count_mentions(conn, mentions)
            await count_support(conn, support)
            await conn.execute("DELETE FROM memories WHERE tenant = %s AND id = %s", (tenant, memory_id))
            restored = None
            if restore_previous and current and mem_key is not None:
                restored = await restore_newest(conn, tenant, mem_key)
            await conn.execute(
                "INSERT INTO outbox (tenant, memory_id, op) VALUES (%s, %s, 'delete')",
                (tenant, memory_id),
            )
            if restored is not None:
                await conn.execute(
                    "INSERT INTO outbox (tenant, memory_id, op) VALUES (%s, %s, 'upsert')",
                    (tenant, restored),
                )
            await conn.execute(f"NOTIFY {NOTIFY_CHANNEL}")
            # A restored version included: a cached answer never outlives it.
            await bump_generations(conn, [tenant])
        return Deleted(deleted=memory_id, restored=restored)

    async def memory(self, tenant: str, memory_id: str) -> MemoryRecord | None:
        """The tenant's memory ``memory_id`` as stored, or ``None``: one round trip."""
        sql = f"SELECT {RECORD_COLUMNS} FROM memories m WHERE m.tenant = %s AND m.id = %s"
        (rows,) = await tenant_reads(self.pool, tenant, [Read(sql, (tenant, memory_id), dict_row)])
        return record_from_row(rows[0]) if rows else None

    async def versions(self, tenant: str, mem_key: str, limit: int) -> list[MemoryRecord]:
        """The tenant's memories of ``mem_key``, newest first (by ``created_at``,
        then id), at most ``limit``: one scan of ``memories_tenant_key``, one round trip."""
        sql = (
            f"SELECT {RECORD_COLUMNS} FROM memories m WHERE m.tenant = %s AND m.mem_key = %s"
            " ORDER BY m.created_at DESC, m.id DESC LIMIT %s"
        )
        (rows,) = await tenant_reads(self.pool, tenant, [Read(sql, (tenant, mem_key, limit), dict_row)])
        return [record_from_row(r) for r in rows]

    async def live(self, tenant: str, ids: Sequence[str], as_of: datetime | None) -> set[str]:
        """Those of ``ids`` the tenant has that are current (or with ``as_of``,
        were then: :func:`.sql.lifecycle_clause`), in one round trip: one
        primary-key look-up per id, whatever plan Postgres caches."""
        if not ids:
            return set()
        cond, params = lifecycle_clause(as_of)
        sql = by_ids_sql("m.id", cond)
        (rows,) = await tenant_reads(
            self.pool, tenant, [Read(sql, {"tenant": tenant, "ids": TextArray(ids), **params})]
        )
        return {row[0] for row in rows}

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
        """Every speaker name the tenant's memories have had: one round trip."""
        (rows,) = await tenant_reads(
            self.pool, tenant, [Read("SELECT name FROM speakers WHERE tenant = %s", (tenant,))]
        )
        return [row[0] for row in rows]

    async def embeddings(self, tenant: str, ids: Sequence[str], model: str) -> dict[str, np.ndarray]:
        """The stored (unit) embeddings of ``ids`` that the tenant has and
        ``model`` made, in one round trip; a memory stored without one, or with
        another model's, is absent."""
        if not ids:
            return {}
        sql = by_ids_sql("m.id, m.embedding", "m.model = %(model)s AND m.embedding IS NOT NULL")
        (rows,) = await tenant_reads(
            self.pool, tenant, [Read(sql, {"tenant": tenant, "ids": TextArray(ids), "model": model})]
        )
        # pgvector's loader gives a Vector; its to_numpy() is float32 already.
        return {row[0]: row[1].to_numpy() for row in rows}

    async def recent(
        self,
        tenant: str,
        filters: Filters,
        *,
        min_confidence: float,
        memory_tiers: Sequence[str],
        limit: int,
        forgetting: Forgetting | None = None,
    ) -> list[Hit]:
        """The tenant's newest ``limit`` memories matching ``filters``, newest
        first (ties by id, descending), each scored by its epoch seconds. One
        statement; with a ``session_id`` a backward scan of
        ``memories_tenant_session_created``, else of ``memories_tenant_created``;
        one round trip."""
        where, params = filter_clause(
            filters, min_confidence=min_confidence, memory_tiers=memory_tiers, forgetting=forgetting
        )
        params.update({"tenant": tenant, "limit": limit})
        sql = (
            f"SELECT {HIT_COLUMNS} FROM memories m WHERE m.tenant = %(tenant)s AND {where}"
            " ORDER BY m.created_at DESC, m.id DESC LIMIT %(limit)s"
        )
        (rows,) = await tenant_reads(self.pool, tenant, [Read(sql, params, dict_row)])
        return [hit_from_row(r, r["created_at"].timestamp()) for r in rows]

    async def unindexed(
        self,
        tenant: str,
        filters: Filters,
        *,
        min_confidence: float,
        memory_tiers: Sequence[str],
        limit: int,
        forgetting: Forgetting | None = None,
        embeddings: bool = True,
    ) -> list[MemoryRecord]:
        """The tenant's memories written but not yet in Typesense (an outbox
        ``upsert`` row still pending: new, or rewritten since their document
        was made) that match ``filters``: the newest ``limit`` pending rows'
        memories, as stored now, without their embeddings unless
        ``embeddings`` (reading and converting a vector costs more than the
        rest of the row). One statement, a backward scan of the pending rows'
        partial index and a primary-key read per pending memory; one round trip."""
        where, params = filter_clause(
            filters, min_confidence=min_confidence, memory_tiers=memory_tiers, forgetting=forgetting
        )
        params.update({"tenant": tenant, "limit": limit})
        columns = RECORD_COLUMNS if embeddings else RECORD_COLUMNS_NO_EMBEDDING
        # Each pending id looked up by the primary key (the LIMIT 1 keeps the
        # planner from joining otherwise): with `m.id = ANY(...)` it scanned the
        # tenant's rows when it expected few pending ones (12 ms at 10k).
        sql = f"""
            SELECT {columns} FROM (
                SELECT DISTINCT o.memory_id FROM (
                    SELECT o.memory_id FROM outbox o
                    WHERE o.processed_at IS NULL AND o.tenant = %(tenant)s AND o.op = 'upsert'
                    ORDER BY o.id DESC LIMIT %(limit)s
                ) o
            ) pending
            CROSS JOIN LATERAL (
                SELECT * FROM memories m
                WHERE m.tenant = %(tenant)s AND m.id = pending.memory_id AND {where}
                LIMIT 1
            ) m
            ORDER BY m.id
        """
        (rows,) = await tenant_reads(self.pool, tenant, [Read(sql, params, dict_row)])
        return [record_from_row(r) for r in rows]

    async def sweep(self, forgetting: Forgetting, batch: int) -> dict[str, int]:
        """Remove up to ``batch`` expired memories, of any tenant, in one
        transaction: their rows and mentions (mention counts kept), an outbox
        ``delete`` row each (Typesense follows through :mod:`indexers.sync`),
        and a generation bump per tenant touched. Returns tenant -> memories removed.

        The rows are chosen and locked by one statement that checks the rule
        (:meth:`Forgetting.sweep_sql`) on each row as it locks it, skipping rows
        another transaction holds: a memory rewritten meanwhile with a later
        expiry is either seen as rewritten (and kept) or skipped until the next sweep.
        """
        dead, params = forgetting.sweep_sql("m")
        params["batch"] = batch
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                f"SELECT m.tenant, m.id FROM memories m WHERE {dead}"
                " ORDER BY m.tenant, m.id LIMIT %(batch)s FOR UPDATE SKIP LOCKED",
                params,
            )
            keys = await cur.fetchall()
            if not keys:
                return {}
            tenants = [t for t, _ in keys]
            ids = [i for _, i in keys]
            cur = await conn.execute(
                "DELETE FROM mentions mn USING unnest(%s::text[], %s::text[]) AS k(tenant, id)"
                " WHERE mn.tenant = k.tenant AND mn.memory_id = k.id RETURNING mn.entity_id",
                (tenants, ids),
            )
            delta: Counter[int] = Counter()
            delta.subtract(eid for (eid,) in await cur.fetchall())
            await count_mentions(conn, delta)
            cur = await conn.execute(
                "DELETE FROM relation_support rs USING unnest(%s::text[], %s::text[]) AS k(tenant, id)"
                " WHERE rs.tenant = k.tenant AND rs.memory_id = k.id RETURNING rs.relation_id",
                (tenants, ids),
            )
            support: Counter[int] = Counter()
            support.subtract(rid for (rid,) in await cur.fetchall())
            await count_support(conn, support)
            await conn.execute(
                "DELETE FROM memories m USING unnest(%s::text[], %s::text[]) AS k(tenant, id)"
                " WHERE m.tenant = k.tenant AND m.id = k.id",
                (tenants, ids),
            )
            await conn.execute(
                "INSERT INTO outbox (tenant, memory_id, op) SELECT k.tenant, k.id, 'delete'"
                " FROM unnest(%s::text[], %s::text[]) AS k(tenant, id)",
                (tenants, ids),
            )
            await conn.execute(f"NOTIFY {NOTIFY_CHANNEL}")
            await bump_generations(conn, tenants)
        return dict(Counter(tenants))

    async def drop_tombstones(self) -> int:
        """Delete the tombstones of relations, mentions and entities older than :data:`TOMBSTONE_KEEP`
        (:mod:`indexers.graph_cache`: every service process
        reads its tenants' changes, tombstones included, more often than
        that); return how many went."""
        dropped = 0
        async with self.pool.connection() as conn:
            for table in ("relation_tombstones", "mention_tombstones", "entity_tombstones"):
                cur = await conn.execute(
                    f"DELETE FROM {table} WHERE dropped_at < clock_timestamp() - %s::interval", (TOMBSTONE_KEEP,)
                )
                dropped += cur.rowcount
        return dropped

    async def fetch_records(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], MemoryRecord]:
        """Current rows for (tenant, id) pairs; missing ones are absent."""
        if not keys:
            return {}
        async with self.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(
                f"""
                SELECT {RECORD_COLUMNS}
                FROM memories m
                JOIN unnest(%s::text[], %s::text[]) AS k(tenant, id)
                  ON m.tenant = k.tenant AND m.id = k.id
                """,
                ([t for t, _ in keys], [i for _, i in keys]),
            )
            rows = await cur.fetchall()
        return {(r["tenant"], r["id"]): record_from_row(r) for r in rows}
