"""Edits of the entity graph: entities and the relations between them.

Entities are found by name (:func:`.names.normalize_name`); every edit is one
transaction scoped to the tenant.
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
from psycopg_pool import AsyncConnectionPool

from .generations import bump_generations
from .models import EntityInput, RelationInput
from .names import normalize_name
from .pool import tenant_transaction
from .sql import vector_param
from .unshared import flag_entities, move_entities

__all__ = ["GraphWrites", "upsert_entities"]


async def upsert_entities(
    conn: psycopg.AsyncConnection,
    tenant: str,
    entities: Sequence[EntityInput],
    *,
    overwrite: bool,
    exact_below: int | None = None,
) -> None:
    """Insert ``entities`` in the caller's transaction; an existing one (by
    normalised name) is updated with ``overwrite``, else left as it is.
    ``exact_below``: the entity tier's ``exactBelow``, under which a small
    tenant's new entities stay out of the entities' index
    (:func:`.unshared.flag_entities`); None: every entity goes in."""
    small, move = await flag_entities(conn, tenant, len(entities), exact_below)
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
            INSERT INTO entities (tenant, name, name_norm, type, summary, embedding, model, small)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
            ON CONFLICT (tenant, name_norm) {conflict}
            """,
            [
                (
                    tenant,
                    " ".join(e.name.split()),
                    normalize_name(e.name),
                    e.type,
                    e.summary,
                    vector_param(e.embedding),
                    e.model,
                    small,
                )
                # In name order (stable: a repeated name's last row still
                # wins), so writers creating the same entities cannot
                # wait on each other's inserts in opposite orders.
                for e in sorted(entities, key=lambda e: normalize_name(e.name))
            ],
        )
    if move:
        await move_entities(conn, tenant)


class GraphWrites:
    """The graph edits of :class:`~indexers.postgres.store.PostgresStore`,
    on its pool."""

    pool: AsyncConnectionPool

    async def write_graph(
        self,
        tenant: str,
        entities: Sequence[EntityInput],
        relations: Sequence[RelationInput],
        entity_exact_below: int | None = None,
    ) -> dict[str, int]:
        """Upsert entities, then relations between entities by name, in one transaction
        (``entity_exact_below``: :func:`upsert_entities`' ``exact_below``).

        A relation extracted from memories with the same identity becomes the
        client's: no longer derived, weighted as the client says.

        Every name a relation uses must be in ``entities`` or already exist;
        the caller makes sure of that (it embeds the missing names).
        """
        async with tenant_transaction(self.pool, tenant) as conn:
            if entities:
                await upsert_entities(conn, tenant, entities, overwrite=True, exact_below=entity_exact_below)
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
                        DO UPDATE SET weight = EXCLUDED.weight, valid_to = EXCLUDED.valid_to,
                                      derived = false
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
            await bump_generations(conn, [tenant])
        return {"entities": len(entities), "relations": len(relations)}

    async def delete_relations(self, tenant: str, source: str, target: str, relation: str | None = None) -> int:
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
            if cur.rowcount:
                await bump_generations(conn, [tenant])
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
                "DELETE FROM relations WHERE tenant = %(tenant)s AND (source_id = %(id)s OR target_id = %(id)s)",
                {"tenant": tenant, "id": row[0]},
            )
            relations = cur.rowcount
            # Mentions and the entity's degree row go by cascade.
            await conn.execute("DELETE FROM entities WHERE tenant = %s AND id = %s", (tenant, row[0]))
            await bump_generations(conn, [tenant])
            return relations
