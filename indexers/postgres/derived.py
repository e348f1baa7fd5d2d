"""What the graph learns from memories' texts, kept in step with the memories.

A memory's links to entities are its ``mentions`` (:func:`link_mentions`),
each entity's ``mention_count`` kept exact. Relations extracted from memories
(:mod:`indexers.extraction`) are *derived*: ``relations.derived`` is true, and
each memory that states one has a ``relation_support`` row for it, so a
derived relation's ``weight`` is the number of memories supporting it,
accumulating across writes and falling again when a memory is rewritten,
deleted or swept (:func:`replace_support`, :func:`drop_support`). A derived
relation at weight 0 stays (a concurrent writer may be adding support to it)
and the walk skips it. A client's relation of the same identity
(``POST /v1/graph``) takes the row over: it is no longer derived, and its
weight is the client's.

Every function runs in the caller's transaction.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import psycopg

__all__ = [
    "SupportRow",
    "count_mentions",
    "count_support",
    "drop_support",
    "link_mentions",
    "replace_support",
    "unlink",
]

#: (memory id, source name, relation, target name), names normalised.
SupportRow = tuple[str, str, str, str]


#: Applies net changes to the entities' ``mention_count`` (migration 19: a
#: narrow ``entity_degrees`` row each, updated in place), given a CTE
#: ``delta(id, n)`` before it, with ``n`` never 0. The entity rows are locked
#: in id order, each before its count changes (the insert takes the locked
#: rows in id order), so concurrent writers touching overlapping entities
#: queue instead of deadlocking. ``FOR NO KEY UPDATE`` does not conflict with
#: the key-share locks that writers' mention inserts hold on the same entities.
_COUNT_MENTIONS = """
    locked AS MATERIALIZED (
        SELECT id, tenant FROM entities WHERE id IN (SELECT id FROM delta) ORDER BY id FOR NO KEY UPDATE
    )
    INSERT INTO entity_degrees (entity_id, tenant, mention_count)
    SELECT e.id, e.tenant, d.n FROM locked e JOIN delta d ON d.id = e.id
    ORDER BY e.id
    ON CONFLICT (entity_id) DO UPDATE SET mention_count = entity_degrees.mention_count + EXCLUDED.mention_count
"""

#: Applies net changes to the derived relations' weights, given a CTE
#: ``delta(id, n)`` before it. However the update is planned, it reads the
#: locked rows in id order and changes a row only once that row is locked:
#: the locks are taken in id order, so writers touching the same relations
#: queue instead of deadlocking.
_COUNT_SUPPORT = """
    locked AS MATERIALIZED (
        SELECT id FROM relations WHERE id IN (SELECT id FROM delta) ORDER BY id FOR NO KEY UPDATE
    )
    UPDATE relations SET weight = greatest(relations.weight + d.n, 0)
    FROM locked JOIN delta d ON d.id = locked.id
    WHERE relations.id = locked.id AND relations.derived
"""


def _entity(alias: str, name: str) -> str:
    """The tenant's entity whose normalised name is ``name`` (a column), as
    ``alias`` (column ``id``), by one index probe: no row when there is none.

    A row matched to entities or memories is matched by a probe of its own
    (``LATERAL ... LIMIT 1``, which the planner cannot turn into a join). As
    plain joins, a few dozen rows (the name candidates of one short turn)
    were planned as a hash of all the tenant's memories or entities: a
    write's Postgres time grew with the tenant (``benchmarks.store_writes``).
    """
    return (
        f"CROSS JOIN LATERAL (SELECT id FROM entities WHERE tenant = %(tenant)s AND name_norm = {name} LIMIT 1) {alias}"
    )


def _memory(alias: str, memory_id: str, columns: str = "id") -> str:
    """The tenant's memory ``memory_id`` (a column) as ``alias``, by one
    index probe (see :func:`_entity`): no row when it is gone."""
    return (
        f"CROSS JOIN LATERAL (SELECT {columns} FROM memories WHERE tenant = %(tenant)s AND id = {memory_id} LIMIT 1)"
        f" {alias}"
    )


def _net_delta(cte: str, column: str) -> str:
    """``delta(id, n)``: one for each row of ``cte`` (its ids in ``column``)
    plus the changes of parameters ``ids`` and ``ns``, summed by id, zeros left out."""
    return f"""delta AS (
        SELECT c.id, sum(c.n) AS n FROM (
            SELECT {column}, 1::bigint FROM {cte}
            UNION ALL SELECT * FROM unnest(%(ids)s::bigint[], %(ns)s::bigint[])
        ) AS c(id, n)
        GROUP BY c.id HAVING sum(c.n) <> 0
    ),"""


#: ``delta(id, n)`` from parameters ``ids`` and ``ns``.
_GIVEN_DELTA = "delta AS (SELECT * FROM unnest(%(ids)s::bigint[], %(ns)s::bigint[]) AS d(id, n)),"


#: Links (parameters ``mids``, ``names``) and counts them with ``ids``/``ns`` (:func:`link_mentions`).
_LINK_MENTIONS = f"""
        WITH linked AS (
            INSERT INTO mentions (tenant, memory_id, entity_id, created_at)
            SELECT %(tenant)s, l.memory_id, e.id, m.created_at
            FROM unnest(%(mids)s::text[], %(names)s::text[]) AS l(memory_id, name_norm)
            {_entity("e", "l.name_norm")}
            {_memory("m", "l.memory_id", "created_at")}
            ON CONFLICT DO NOTHING
            RETURNING entity_id
        ),
        {_net_delta("linked", "entity_id")}
        {_COUNT_MENTIONS}
        """

#: Creates the derived relations named (``sources``, ``relations``, ``targets``) that do not exist.
_INSERT_RELATIONS = f"""
            INSERT INTO relations (tenant, source_id, relation, target_id, weight, derived)
            SELECT %(tenant)s, s.id, d.relation, t.id, 0, true
            FROM unnest(%(sources)s::text[], %(relations)s::text[], %(targets)s::text[])
                 WITH ORDINALITY AS d(source, relation, target, n)
            {_entity("s", "d.source")}
            {_entity("t", "d.target")}
            ORDER BY d.n
            ON CONFLICT (tenant, source_id, relation, target_id, coalesce(valid_from, '-infinity')) DO NOTHING
            """

#: Inserts the support rows (``mids``, ``sources``, ``relations``, ``targets``) and moves the
#: weights by them and by ``ids``/``ns`` (:func:`replace_support`).
_SUPPORT = f"""
            WITH supported AS (
                INSERT INTO relation_support (tenant, memory_id, relation_id)
                SELECT %(tenant)s, d.memory_id, r.id
                FROM unnest(%(mids)s::text[], %(sources)s::text[], %(relations)s::text[], %(targets)s::text[])
                     AS d(memory_id, source, relation, target)
                {_memory("m", "d.memory_id")}
                {_entity("s", "d.source")}
                {_entity("t", "d.target")}
                -- One index probe per row, whatever the statistics say: on a
                -- tenant's first large write they still count the relations
                -- just inserted as none, and a join planned from that hashes
                -- all the tenant's relations against every row (2.8 s for 250
                -- memories). LIMIT 1 keeps the probe a probe (at most one row
                -- matches: the unique key with valid_from NULL).
                CROSS JOIN LATERAL (
                    SELECT r.id FROM relations r
                    WHERE r.tenant = %(tenant)s AND r.source_id = s.id AND r.relation = d.relation
                          AND r.target_id = t.id AND r.valid_from IS NULL
                    LIMIT 1
                ) r
                ON CONFLICT DO NOTHING
                RETURNING relation_id
            ),
            {_net_delta("supported", "relation_id")}
            {_COUNT_SUPPORT}
            """


def _changes(delta: Counter[int]) -> dict[str, list[int]]:
    changes = sorted((i, n) for i, n in delta.items() if n)
    return {"ids": [i for i, _ in changes], "ns": [n for _, n in changes]}


async def count_mentions(conn: psycopg.AsyncConnection, delta: Counter[int]) -> None:
    """Apply net mention-count changes (entity id -> +/-n), in one statement."""
    changes = _changes(delta)
    if changes["ids"]:
        await conn.execute(f"WITH {_GIVEN_DELTA} {_COUNT_MENTIONS}", changes)


async def link_mentions(
    conn: psycopg.AsyncConnection,
    tenant: str,
    links: Sequence[tuple[str, str]],
    delta: Counter[int] | None = None,
) -> None:
    """Link memories to the existing entities named (``(memory id, normalised
    name)`` pairs; names without an entity are skipped, links already there
    kept) and count the new links in the entities' mention counts, together
    with the changes ``delta`` (entity id -> +/-n, e.g. from :func:`unlink`):
    one statement."""
    if not links:
        await count_mentions(conn, delta or Counter())
        return
    # created_at is the memory's (copied for the newest-first fetch); the
    # memory row is locked by the caller's upsert, or read as it is now.
    await conn.execute(
        _LINK_MENTIONS,
        {
            "tenant": tenant,
            "mids": [mid for mid, _ in links],
            "names": [n for _, n in links],
            **_changes(delta or Counter()),
        },
    )


async def unlink(conn: psycopg.AsyncConnection, tenant: str, ids: Sequence[str]) -> tuple[Counter[int], Counter[int]]:
    """Remove the memories ``ids``' mentions and the support they gave, in
    one statement; returns both, negated (entity id -> -n, relation id ->
    -n), for :func:`link_mentions` (or :func:`count_mentions`) and
    :func:`replace_support` (or :func:`count_support`)."""
    mentions: Counter[int] = Counter()
    support: Counter[int] = Counter()
    if ids:
        cur = await conn.execute(
            """
            WITH m AS (
                DELETE FROM mentions WHERE tenant = %(tenant)s AND memory_id = ANY(%(ids)s) RETURNING entity_id
            ), s AS (
                DELETE FROM relation_support WHERE tenant = %(tenant)s AND memory_id = ANY(%(ids)s)
                RETURNING relation_id
            )
            SELECT true, entity_id FROM m UNION ALL SELECT false, relation_id FROM s
            """,
            {"tenant": tenant, "ids": list(ids)},
        )
        for mention, eid in await cur.fetchall():
            (mentions if mention else support)[eid] -= 1
    return mentions, support


async def count_support(conn: psycopg.AsyncConnection, delta: Counter[int]) -> None:
    """Apply net support changes (relation id -> +/-n) to the derived
    relations' weights, in one statement."""
    changes = _changes(delta)
    if changes["ids"]:
        await conn.execute(f"WITH {_GIVEN_DELTA} {_COUNT_SUPPORT}", changes)


async def drop_support(conn: psycopg.AsyncConnection, tenant: str, ids: Sequence[str]) -> Counter[int]:
    """Remove the support the memories ``ids`` gave; returns it, negated, to
    pass to :func:`count_support` (with what replaces it, if anything)."""
    delta: Counter[int] = Counter()
    if ids:
        cur = await conn.execute(
            "DELETE FROM relation_support WHERE tenant = %s AND memory_id = ANY(%s) RETURNING relation_id",
            (tenant, list(ids)),
        )
        delta.subtract(rid for (rid,) in await cur.fetchall())
    return delta


async def replace_support(
    conn: psycopg.AsyncConnection,
    tenant: str,
    ids: Sequence[str],
    rows: Sequence[SupportRow],
    *,
    dropped: Counter[int] | None = None,
) -> None:
    """The memories ``ids`` support exactly the relations of ``rows`` from now
    on: their old support is dropped, each relation of ``rows`` is created
    (derived, weight 0) if it does not exist, supported by its memory, and
    the weights move by the difference. Entities must exist; a row whose
    memory is gone (deleted meanwhile) is skipped. ``dropped``: the old
    support, already removed by the caller (:func:`unlink`), negated."""
    delta = await drop_support(conn, tenant, ids) if dropped is None else Counter(dropped)
    if rows:
        # Each relation once, in one order: writers creating the same
        # relations cannot wait on each other's inserts in opposite orders.
        triples = sorted({(s, r, t) for _, s, r, t in rows})
        await conn.execute(
            _INSERT_RELATIONS,
            {
                "tenant": tenant,
                "sources": [s for s, _, _ in triples],
                "relations": [r for _, r, _ in triples],
                "targets": [t for _, _, t in triples],
            },
        )
        # The new support and the weights it moves, in one statement.
        await conn.execute(
            _SUPPORT,
            {
                "tenant": tenant,
                "mids": [m for m, _, _, _ in rows],
                "sources": [s for _, s, _, _ in rows],
                "relations": [r for _, _, r, _ in rows],
                "targets": [t for _, _, _, t in rows],
                **_changes(delta),
            },
        )
    else:
        await count_support(conn, delta)
