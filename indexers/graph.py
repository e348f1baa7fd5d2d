"""The entity graph in Postgres: seed, walk, score, and return facts and memories.

1. **Seeds.** Entities the query names (its 1-4 word n-grams against the
   normalised entity names, weight 1.0) plus the nearest entities by vector
   in the entity tier (weight = cosine similarity, kept above
   ``graph.seedMinSimilarity``).
2. **Walk.** One recursive query follows relations in both directions up to
   ``graph.maxHops`` hops, skipping relations outside their validity window
   (at the recall's ``as_of``, when it travels in time: then relations
   written after it are skipped too).
3. **Score.** Personalized PageRank (networkx) over the fetched
   neighbourhood, restarting at the seeds in proportion to their weight, with
   relation weights as edge weights. PPR was chosen over hop decay because it
   rewards entities reached by many paths and damps hubs, and it needs no
   per-hop tuning: distance is already in the restart probability.
4. **Results.** Each relation becomes a fact ("Alex prefers TypeScript."),
   scored ``weight * (ppr(source) + ppr(target))``; each memory that mentions
   reached entities gets a share of their PPR, each entity's split evenly
   among the memories mentioning it (a walk step from entity to memory), so
   an entity named everywhere weighs little on each. One list, best first.

   The split uses the entity's true degree (``entities.mention_count``, kept
   exact by every write), but only the ``graph.mentionsPerEntity`` newest
   memories of each entity are read, so the step stays bounded however many
   memories name a hub. Below the cap scores are exact. Above it, what is
   dropped is shares of ``ppr / degree``, tiny per memory; but a memory that
   earns its rank by naming several reached hubs can be missed (or scored
   lower) if it is not among their newest. A cap above every entity's degree
   gives the exact ranking back (the costs measured: docs/design.md,
   "Measured choices"). A recall's own filters (session, tags, metadata,
   importance, ...) apply inside the cap: the newest *matching* mentions are
   read, so a selective filter still fills the list; reading them may then
   visit up to the entity's degree in mentions. Without request filters the
   cap reads mentions alone, as before.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import anyio
import networkx as nx
import numpy as np
import psycopg
from psycopg.rows import dict_row

from config import BraidConfig

from .base import Filters, Hit, SearchQuery, SourceUnavailable
from .lifecycle import Forgetting
from .pgvector import nearest_sql, set_search_params
from .postgres import (
    HIT_COLUMNS,
    PoolSource,
    filter_clause,
    hit_from_row,
    name_candidates,
    tenant_transaction,
)
from .registry import register

#: The tenant's entities nearest to the query vector (seeds of the walk).
#: Only entities whose name the query vector's model embedded are compared with it.
_SEED_SQL = nearest_sql("e.id", "entities e", "e.tenant = %(tenant)s AND e.model = %(model)s", "e.embedding")

__all__ = ["GraphSource", "fact_sentence", "personalized_pagerank"]

log = logging.getLogger("braid.graph")

FACT_KIND = "fact"


def fact_sentence(source: str, relation: str, target: str) -> str:
    """``Alex``, ``prefers``, ``TypeScript`` -> ``Alex prefers TypeScript.``"""
    verb = " ".join(relation.replace("_", " ").split())
    return f"{source} {verb} {target}."


def personalized_pagerank(
    edges: list[tuple[int, int, float]],
    seeds: dict[int, float],
    *,
    damping: float,
) -> dict[int, float]:
    """PPR over an undirected weighted graph; isolated seeds keep their share."""
    graph = nx.Graph()
    graph.add_nodes_from(seeds)
    for a, b, w in edges:
        if graph.has_edge(a, b):
            graph[a][b]["weight"] += w
        else:
            graph.add_edge(a, b, weight=max(w, 1e-6))
    total = sum(seeds.values())
    if total <= 0:
        return {}
    personalization = {n: seeds.get(n, 0.0) / total for n in graph.nodes}
    return dict(nx.pagerank(graph, alpha=damping, personalization=personalization, weight="weight"))


#: From this many edges PageRank runs in a worker thread, off the event loop
#: (docs/design.md: about 1 ms at 200 edges, 8 ms at 2,000).
_THREAD_FROM_EDGES = 256


async def _pagerank(edges: list[tuple[int, int, float]], seeds: dict[int, float], damping: float) -> dict[int, float]:
    if len(edges) < _THREAD_FROM_EDGES:
        return personalized_pagerank(edges, seeds, damping=damping)
    return await anyio.to_thread.run_sync(lambda: personalized_pagerank(edges, seeds, damping=damping))


#: Relations already logged as unreadable (each is logged once per process).
_UNREADABLE: set[int] = set()


def _instant(relation_id: int, seconds: float) -> datetime | None:
    """A relation's time from epoch seconds; None (logged once) if Python cannot hold it."""
    try:
        return datetime.fromtimestamp(seconds, tz=UTC)
    except (OverflowError, OSError, ValueError):
        if relation_id not in _UNREADABLE and len(_UNREADABLE) < 100_000:
            _UNREADABLE.add(relation_id)
            log.warning("relation %s skipped: its time (%s s) is outside years 1-9999", relation_id, seconds)
        return None


class GraphSource(PoolSource):
    name = "graph"
    #: Without a vector it is seeded by the entities the query names.
    needs_vector = False

    async def search(self, query: SearchQuery) -> list[Hit]:
        cfg = self._get_config()
        try:
            async with tenant_transaction(self._pool, query.tenant) as conn:
                seeds = await self._seeds(conn, cfg, query)
                if not seeds:
                    return []
                hops = cfg.graph.max_hops if query.hops is None else query.hops
                edges, names = await self._walk(conn, cfg, query.tenant, list(seeds), hops, query.filters.as_of)
                ppr = await _pagerank(
                    [(e["source_id"], e["target_id"], float(e["weight"])) for e in edges],
                    seeds,
                    cfg.graph.damping,
                )
                hits = self._facts(cfg, query, edges, names, ppr)
                hits += await self._memories(conn, cfg, query, ppr)
        except psycopg.Error as exc:
            raise SourceUnavailable(self.name, str(exc).strip() or type(exc).__name__) from exc
        hits.sort(key=lambda h: (-h.score, h.id))
        return hits[: query.limit]

    async def _seeds(self, conn: psycopg.AsyncConnection, cfg: BraidConfig, query: SearchQuery) -> dict[int, float]:
        seeds: dict[int, float] = {}
        cur = await conn.execute(
            "SELECT id FROM entities WHERE tenant = %s AND name_norm = ANY(%s)",
            (query.tenant, name_candidates(query.text)),
        )
        for (eid,) in await cur.fetchall():
            seeds[eid] = 1.0
        if query.vector is not None and cfg.graph.seed_limit > 0:
            tier = cfg.tiers[cfg.entity_tier]
            # A savepoint rolled back after the read: the search settings end
            # with it and do not reach the walk's statements.
            async with conn.transaction(force_rollback=True):
                await set_search_params(conn, tier.ef_search)
                cur = await conn.execute(
                    _SEED_SQL,
                    {
                        "vec": np.asarray(query.vector, dtype=np.float32),
                        "tenant": query.tenant,
                        "model": query.model,
                        "limit": cfg.graph.seed_limit,
                        "exact_below": tier.exact_below,
                    },
                )
                for eid, distance in await cur.fetchall():
                    sim = 1.0 - float(distance)
                    if sim >= cfg.graph.seed_min_similarity:
                        seeds[eid] = max(seeds.get(eid, 0.0), sim)
        return seeds

    async def _walk(
        self,
        conn: psycopg.AsyncConnection,
        cfg: BraidConfig,
        tenant: str,
        seeds: list[int],
        hops: int,
        as_of: datetime | None,
    ) -> tuple[list[dict[str, Any]], dict[int, str]]:
        """The relations within ``hops`` of the seeds that are valid now, or
        with ``as_of`` were then (valid at that instant, and already written)."""
        at = "now()" if as_of is None else "%(as_of)s"
        valid = f"(r.valid_from IS NULL OR r.valid_from <= {at}) AND (r.valid_to IS NULL OR r.valid_to > {at})"
        if as_of is not None:
            valid += " AND r.created_at <= %(as_of)s"
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(
                f"""
                WITH RECURSIVE walk(entity_id, depth) AS (
                    SELECT unnest(%(seeds)s::bigint[]), 0
                    UNION
                    SELECT nb.entity_id, w.depth + 1
                    FROM walk w
                    CROSS JOIN LATERAL (
                        SELECT r.target_id AS entity_id FROM relations r
                        WHERE r.tenant = %(tenant)s AND r.source_id = w.entity_id AND {valid}
                        UNION
                        SELECT r.source_id FROM relations r
                        WHERE r.tenant = %(tenant)s AND r.target_id = w.entity_id AND {valid}
                    ) nb
                    WHERE w.depth < %(hops)s
                ),
                reached AS (SELECT DISTINCT entity_id FROM walk)
                SELECT r.id, r.source_id, r.target_id, r.relation, r.weight,
                       -- As seconds: a row whose time Python cannot hold is
                       -- skipped in _facts instead of failing the whole read.
                       extract(epoch FROM coalesce(r.valid_from, r.created_at))::float8 AS created_at
                FROM relations r
                WHERE r.tenant = %(tenant)s
                  AND r.source_id IN (SELECT entity_id FROM reached)
                  AND r.target_id IN (SELECT entity_id FROM reached)
                  AND {valid}
                ORDER BY r.weight DESC, r.id
                LIMIT %(max_edges)s
                """,
                {
                    "seeds": seeds,
                    "tenant": tenant,
                    "hops": hops,
                    "max_edges": cfg.graph.max_edges,
                    "as_of": as_of,
                },
            )
            edges = list(await cur.fetchall())
            ids = {e["source_id"] for e in edges} | {e["target_id"] for e in edges} | set(seeds)
            await cur.execute(
                "SELECT id, name FROM entities WHERE tenant = %s AND id = ANY(%s)",
                (tenant, list(ids)),
            )
            names = {row["id"]: row["name"] for row in await cur.fetchall()}
        return edges, names

    def _facts(
        self,
        cfg: BraidConfig,
        query: SearchQuery,
        edges: list[dict[str, Any]],
        names: dict[int, str],
        ppr: dict[int, float],
    ) -> list[Hit]:
        f = query.filters
        # Facts have no session, tags, metadata, importance or memory tier: a
        # filter on those excludes them.
        if f.session_id is not None or f.tags or f.metadata or f.min_importance is not None:
            return []
        if f.kinds is not None and FACT_KIND not in f.kinds:
            return []
        if f.tiers is not None and cfg.entity_tier not in f.tiers:
            return []
        hits = []
        for e in edges:
            created = _instant(e["id"], e["created_at"])
            if created is None:
                continue
            if f.created_after is not None and created < f.created_after:
                continue
            if f.created_before is not None and created > f.created_before:
                continue
            score = float(e["weight"]) * (ppr.get(e["source_id"], 0.0) + ppr.get(e["target_id"], 0.0))
            hits.append(
                Hit(
                    id=f"rel:{e['id']}",
                    content=fact_sentence(names[e["source_id"]], e["relation"], names[e["target_id"]]),
                    kind=FACT_KIND,
                    tier=cfg.entity_tier,
                    created_at=created,
                    confidence=1.0,
                    score=score,
                )
            )
        return hits

    async def _memories(
        self,
        conn: psycopg.AsyncConnection,
        cfg: BraidConfig,
        query: SearchQuery,
        ppr: dict[int, float],
    ) -> list[Hit]:
        if not ppr:
            return []
        where, params = filter_clause(
            query.filters,
            min_confidence=query.min_confidence,
            memory_tiers=cfg.memory_tiers,
            forgetting=Forgetting.from_config(cfg),
        )
        params.update(
            {
                "tenant": query.tenant,
                "eids": list(ppr),
                "scores": [ppr[e] for e in ppr],
                "limit": query.limit,
                "per_entity": cfg.graph.mentions_per_entity,
            }
        )
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(
                f"""
                -- An entity passes its PPR mass on to the memories that mention
                -- it, split evenly among all of them (one more step of the walk)...
                WITH s AS (
                    SELECT e.id AS entity_id, s.score / greatest(e.mention_count, 1) AS share
                    FROM unnest(%(eids)s::bigint[], %(scores)s::float8[]) AS s(entity_id, score)
                    JOIN entities e ON e.id = s.entity_id AND e.tenant = %(tenant)s
                ),
                -- ...of which only the newest few are read.
                linked AS (
                    SELECT mn.memory_id, s.share
                    FROM s CROSS JOIN LATERAL ({_capped_mentions(query.filters, where)}) mn
                ),
                ranked AS (
                    SELECT memory_id, sum(share) AS score FROM linked GROUP BY memory_id
                )
                -- Best first, then the memory rows: the join stops at the limit
                -- instead of fetching every candidate.
                SELECT {HIT_COLUMNS}, r.score
                FROM (SELECT * FROM ranked ORDER BY score DESC, memory_id) r
                CROSS JOIN LATERAL (
                    SELECT * FROM memories m
                    WHERE m.tenant = %(tenant)s AND m.id = r.memory_id AND {where}
                ) m
                ORDER BY r.score DESC, r.memory_id
                LIMIT %(limit)s
                """,
                params,
            )
            rows = await cur.fetchall()
        return [hit_from_row(r, float(r["score"])) for r in rows]


def _capped_mentions(filters: Filters, where: str) -> str:
    """The newest ``%(per_entity)s`` mentions of entity ``s.entity_id``: of
    the memories matching ``where`` when the request filters (so a selective
    filter is not starved by the cap), else read from the mentions index alone."""
    if filters == Filters():
        return """
            SELECT memory_id FROM mentions
            WHERE tenant = %(tenant)s AND entity_id = s.entity_id
            ORDER BY created_at DESC, memory_id DESC
            LIMIT %(per_entity)s"""
    return f"""
        SELECT mn.memory_id FROM mentions mn
        JOIN memories m ON m.tenant = mn.tenant AND m.id = mn.memory_id
        WHERE mn.tenant = %(tenant)s AND mn.entity_id = s.entity_id AND {where}
        ORDER BY mn.created_at DESC, mn.memory_id DESC
        LIMIT %(per_entity)s"""


# Seeded by the names the query mentions (its vector only adds seeds): a
# keyword source, left out of a semantic recall.
register(GraphSource.spec(matches=frozenset({"keyword"})))
