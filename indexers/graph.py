"""The entity graph in Postgres: seed, walk, score, and return facts and memories.

Two round trips to Postgres a search: the seeds and the walk in one
statement, the memories in another, each its own transaction scoped to the
tenant; PageRank runs in Python between them. With ``graph.cacheRows``
the seeds are found and the walk runs in this process instead, over the
tenant's entities and relations kept here (:mod:`indexers.graph_cache`):
the first round trip then brings only what changed in them since the last
read.

1. **Seeds.** Entities the query names (its 1-4 word n-grams against the
   normalised entity names, weight 1.0) plus the nearest entities by vector
   in the entity tier (weight = cosine similarity, kept above
   ``graph.seedMinSimilarity``).
2. **Walk.** One recursive query follows relations in both directions up to
   ``graph.maxHops`` hops, skipping relations outside their validity window
   (at the recall's ``as_of``, when it travels in time: then relations
   written after it are skipped too).
3. **Score.** Personalized PageRank (:mod:`indexers.pagerank`) over the fetched
   neighbourhood, restarting at the seeds in proportion to their weight, with
   relation weights as edge weights. PPR was chosen over hop decay because it
   rewards entities reached by many paths and damps hubs, and it needs no
   per-hop tuning: distance is already in the restart probability.
4. **Results.** Each relation a client wrote becomes a fact ("Alex prefers
   TypeScript."; relations extracted from memories, ``graph.extract``, are
   walked but are not facts: the memories stating them are the evidence),
   scored ``weight * (ppr(source) + ppr(target))``; each memory that mentions
   reached entities gets a share of their PPR, each entity's split evenly
   among the memories mentioning it (a walk step from entity to memory), so
   an entity named everywhere weighs little on each. One list, best first.

   The split uses the entity's true degree (``entity_degrees.mention_count``, kept
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

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from typing import Any

import anyio
import numpy as np
import psycopg
from psycopg.rows import dict_row

from config import BraidConfig, GraphSourceConfig

from .base import Filters, Hit, SearchQuery, SourceUnavailable, failure_reason
from .graph_cache import Edge, GraphCache, Overlay, Refresh, Shares, TenantGraph, Walked, best
from .lifecycle import Forgetting
from .pagerank import pagerank_columns, personalized_pagerank
from .pgvector import nearest_sql, search_settings
from .postgres import (
    HIT_COLUMNS,
    PoolSource,
    Read,
    TextArray,
    by_ids_sql,
    current_generation,
    filter_clause,
    hit_from_row,
    name_candidates,
    tenant_reads,
)
from .postgres.generations import GENERATION_SQL
from .registry import register

__all__ = ["GraphSource", "above_share", "fact_sentence", "personalized_pagerank"]

log = logging.getLogger("braid.graph")

#: How long a tenant's first read into the cache may take before it is given up (and tried again later).
LOAD_TIMEOUT_S = 120.0

FACT_KIND = "fact"


def fact_sentence(source: str, relation: str, target: str) -> str:
    """``Alex``, ``prefers``, ``TypeScript`` -> ``Alex prefers TypeScript.``"""
    verb = " ".join(relation.replace("_", " ").split())
    return f"{source} {verb} {target}."


#: From this many edges PageRank runs in a worker thread, off the event loop
#: (docs/design.md: about 0.9 ms at 1,000 edges, 1.7 ms at 2,000; a thread hop
#: costs about 0.06 ms).
_THREAD_FROM_EDGES = 1000


async def _pagerank(walked: Walked, seeds: dict[int, float], damping: float) -> dict[int, float]:
    """PPR over the walked relations (their ends and weights as arrays)."""

    def run() -> dict[int, float]:
        return pagerank_columns(walked.sources, walked.targets, walked.weights, seeds, damping=damping)

    return run() if len(walked) < _THREAD_FROM_EDGES else await anyio.to_thread.run_sync(run)


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


#: A relation the walk reached: id, source id, target id, relation, weight,
#: time (epoch seconds of ``valid_from``, else ``created_at``), source name,
#: target name (None when walked in this process: read for facts only),
#: derived (extracted from memories: walked, never a fact).
_Edge = Edge


@functools.cache
def _walk_sql(seeded: bool, as_of: bool, bounded: bool = False) -> str:
    """The seeds and the relations within ``%(hops)s`` hops of them, in one statement.

    Seeds: the entities named by ``%(names)s`` (weight 1), and when
    ``seeded`` the ``%(limit)s`` entities nearest to ``%(vec)s`` among
    those the query's model embedded (weight = cosine similarity, kept from
    ``%(min_similarity)s``; the larger weight when both). The walk follows
    relations in both directions, skipping those not valid now, or with
    ``as_of`` not valid then or written after it; of the relations among the
    entities reached, the ``%(max_edges)s`` heaviest are read. ``bounded``
    (``graph.fanout``): an entity is walked through its ``%(fanout)s``
    heaviest relations only (ties by id), and the relations read are those
    the walk went through (for ``hops`` 0, the seeds' own among themselves),
    so a hub's hundreds of light co-occurrences are neither walked nor read.
    Rows: a seed
    as ``(NULL, id, NULL, NULL, NULL, weight, NULL, NULL, NULL)``, then each
    relation as an :data:`_Edge` (its weight as stored, ``real``).
    """
    at = "%(as_of)s" if as_of else "now()"
    valid = f"(r.valid_from IS NULL OR r.valid_from <= {at}) AND (r.valid_to IS NULL OR r.valid_to > {at})"
    # A derived relation no memory supports any more weighs nothing (indexers.postgres.derived).
    valid += " AND (r.weight > 0 OR NOT r.derived)"
    if as_of:
        valid += " AND r.created_at <= %(as_of)s"
    if bounded:
        # Both directions, heaviest first; {of} is the entity walked from. Each
        # direction's first few come in order from its index (migration 16), so
        # a hub's relations are not all read and sorted.
        neighbours = f"""
                SELECT n.entity_id, n.id FROM (
                    (SELECT r.target_id AS entity_id, r.id, r.weight FROM relations r
                     WHERE r.tenant = %(tenant)s AND r.source_id = {{of}} AND {valid}
                     ORDER BY r.weight DESC, r.id LIMIT %(fanout)s)
                    UNION ALL
                    (SELECT r.source_id, r.id, r.weight FROM relations r
                     WHERE r.tenant = %(tenant)s AND r.target_id = {{of}} AND {valid}
                     ORDER BY r.weight DESC, r.id LIMIT %(fanout)s)
                ) n
                ORDER BY n.weight DESC, n.id
                LIMIT %(fanout)s"""
        walked = f"""
        walked AS (
            SELECT DISTINCT nb.id FROM (
                SELECT DISTINCT entity_id FROM walk WHERE depth < greatest(%(hops)s, 1)
            ) x
            CROSS JOIN LATERAL ({neighbours.format(of="x.entity_id")}) nb
        ),"""
        # A relation walked from an entity short of the last hop ends at one
        # reached; with no hop, only those among the seeds are read.
        among_reached = (
            "r.id IN (SELECT id FROM walked)\n              AND (%(hops)s > 0 OR (r.source_id IN (SELECT id FROM seeds)"
            " AND r.target_id IN (SELECT id FROM seeds)))"
        )
    else:
        neighbours = f"""
                SELECT r.target_id AS entity_id FROM relations r
                WHERE r.tenant = %(tenant)s AND r.source_id = {{of}} AND {valid}
                UNION
                SELECT r.source_id FROM relations r
                WHERE r.tenant = %(tenant)s AND r.target_id = {{of}} AND {valid}"""
        walked = ""
        among_reached = "r.source_id IN (SELECT entity_id FROM reached)\n              AND r.target_id IN (SELECT entity_id FROM reached)"
    return f"""
        WITH RECURSIVE {_seeds_cte(seeded)},
        walk(entity_id, depth) AS (
            SELECT id, 0 FROM seeds
            UNION
            SELECT nb.entity_id, w.depth + 1
            FROM walk w
            CROSS JOIN LATERAL ({neighbours.format(of="w.entity_id")}) nb
            WHERE w.depth < %(hops)s
        ),
        reached AS (SELECT DISTINCT entity_id FROM walk),{walked}
        edges AS (
            SELECT r.id, r.source_id, r.target_id, r.relation, r.weight, r.derived,
                   -- As seconds: a row whose time Python cannot hold is
                   -- skipped in _facts instead of failing the whole read.
                   extract(epoch FROM coalesce(r.valid_from, r.created_at))::float8 AS seconds
            FROM relations r
            WHERE r.tenant = %(tenant)s
              AND {among_reached}
              AND {valid}
            ORDER BY r.weight DESC, r.id
            LIMIT %(max_edges)s
        )
        SELECT NULL::bigint, id, NULL::bigint, NULL::text, NULL::real, weight, NULL::text, NULL::text, NULL::bool
        FROM seeds
        UNION ALL
        (SELECT r.id, r.source_id, r.target_id, r.relation, r.weight, r.seconds, s.name, t.name, r.derived
         FROM edges r
         JOIN entities s ON s.tenant = %(tenant)s AND s.id = r.source_id
         JOIN entities t ON t.tenant = %(tenant)s AND t.id = r.target_id
         ORDER BY r.weight DESC, r.id)
        """


def _seeds_cte(seeded: bool) -> str:
    """``seeds (id, weight)``: the entities named by ``%(names)s`` (weight 1),
    and when ``seeded`` the ``%(limit)s`` entities nearest to ``%(vec)s``
    among those the query's model embedded (weight = cosine similarity, kept
    from ``%(min_similarity)s``; the larger weight when both)."""
    near = ""
    if seeded:
        # A small tenant's entities are left out of the index (`small`) and
        # compared exactly beside its walk (indexers.postgres.unshared): up
        # to twice the limit come back, the nearest ones are kept.
        nearest = nearest_sql(
            "e.id", "entities e", "e.tenant = %(tenant)s AND e.model = %(model)s", "e.embedding", aside="e.small"
        )
        near = f"""
            UNION ALL
            (SELECT n.id, 1.0 - n.distance FROM ({nearest}) n
             WHERE 1.0 - n.distance >= %(min_similarity)s
             ORDER BY n.distance, n.id LIMIT %(limit)s)"""
    return f"""seeds AS MATERIALIZED (
            SELECT id, max(weight) AS weight FROM (
                SELECT e.id, 1.0::float8 AS weight FROM entities e
                WHERE e.tenant = %(tenant)s AND e.name_norm = ANY(%(names)s::text[]){near}
            ) s
            GROUP BY id
        )"""


#: The names of the entities ``%(ids)s`` (a fact's ends, walked in the service).
_NAMES_SQL = "SELECT id, name FROM entities WHERE tenant = %(tenant)s AND id = ANY(%(ids)s)"


def above_share(hits: list[Hit], share: float) -> list[Hit]:
    """The ``hits`` scoring at least ``share`` of the best one's score (all of
    them at 0). The walk passes some PageRank to every memory of every entity
    it reaches, so without a cut the list holds most of a small tenant;
    facts and memories are scored on different scales and each cut against
    their own best."""
    best = max((h.score for h in hits), default=0.0)
    if share <= 0 or best <= 0:
        return hits
    return [h for h in hits if h.score >= share * best]


class GraphSource(PoolSource):
    name = "graph"
    #: Without a vector it is seeded by the entities the query names.
    needs_vector = False

    def __init__(self, pool: Any, get_config: Callable[[], BraidConfig]) -> None:
        super().__init__(pool, get_config)
        graph = get_config().graph
        #: The tenants' relations this process walks itself (:mod:`indexers.graph_cache`).
        self.cache = GraphCache(graph.cache_rows, graph.cache_total_rows)
        #: The tenants' first reads out now (:meth:`_load`), held until done.
        self._loads: set[asyncio.Task[None]] = set()

    def stats(self) -> dict[str, int]:
        """The walk's cache in this process (``/health``: ``backends.graph.cache``)."""
        return self.cache.stats()

    async def settle(self) -> None:
        """Wait for the tenants' first reads started so far (their copies kept, or refused)."""
        while self._loads:
            await asyncio.wait(set(self._loads))

    async def aclose(self) -> None:
        """Cancel the tenants' first reads still out."""
        for task in self._loads:
            task.cancel()
        await self.settle()

    def _start_load(self, tenant: str, refresh: Refresh) -> None:
        task = asyncio.get_running_loop().create_task(self._load(tenant, refresh, self.cache.load(tenant)))
        self._loads.add(task)
        task.add_done_callback(self._loads.discard)

    async def _load(self, tenant: str, refresh: Refresh, loading: AbstractAsyncContextManager[None]) -> None:
        """A tenant's first read, off the recall that asked for it: its
        relations and mentions whole (or a refusal when they pass
        ``graph.cacheRows``), the copy built on a worker thread, then kept.
        A failure is logged; the tenant is tried again after a while."""
        started = time.monotonic()
        try:
            async with loading:
                with anyio.fail_after(LOAD_TIMEOUT_S):
                    results = await tenant_reads(self._pool, tenant, refresh.reads())
                delta = refresh.read(results)
                if delta is None:
                    log.info("graph of tenant %s not kept: more than graph.cacheRows", tenant)
                    return
                refresh.keep(await anyio.to_thread.run_sync(TenantGraph.of, delta))
        except (psycopg.Error, TimeoutError) as exc:
            log.warning("graph of tenant %s not loaded: %s", tenant, failure_reason(exc, LOAD_TIMEOUT_S))
            return
        log.info("graph of tenant %s kept: %d rows read in %.2f s", tenant, len(delta), time.monotonic() - started)

    async def search(self, query: SearchQuery) -> list[Hit]:
        """Two round trips to Postgres, each one transaction scoped to the
        tenant: the seeds with their walk (:func:`_walk_sql`; or, seeded and
        walked in this process, what changed in the tenant's graph:
        :mod:`indexers.graph_cache`), then, after PageRank in Python, the
        memories the reached entities pass it to (and the facts' names when
        walked here). A kept copy of a known generation whose last read
        found it unmoved is walked at once and its generation read with the
        memories: one round trip in all when nothing changed; when something
        did, the changes are read and the copy walked again (three). A recall
        with request filters, or of a tenant whose generation moved at its
        last read (written between recalls), reads the generation first,
        alone, as before."""
        cfg = self._get_config()
        try:
            hits = await self._search(cfg, query, assume=query.filters == Filters())
            if hits is None:
                # The copy walked was behind: walk it again with what changed.
                self.cache.walks["stale"] += 1
                hits = await self._search(cfg, query, assume=False, changed=True)
                assert hits is not None
        except psycopg.Error as exc:
            raise SourceUnavailable(self.name, str(exc).strip() or type(exc).__name__) from exc
        hits.sort(key=lambda h: (-h.score, h.id))
        return hits[: query.limit]

    async def _search(
        self, cfg: BraidConfig, query: SearchQuery, *, assume: bool, changed: bool = False
    ) -> list[Hit] | None:
        """The hits, unsorted; None when the copy walked with ``assume`` (taken
        to be current) was not: its generation, read with the memories, had moved."""
        seeds, walked, kept, assumed = await self._walk(cfg, query, assume=assume, changed=changed)
        if not seeds:
            return [] if assumed is None or await self._current(query.tenant, assumed) else None
        ppr = await _pagerank(walked, seeds, cfg.graph.damping)
        section = cfg.source(self.name)
        share = section.relative_floor if isinstance(section, GraphSourceConfig) else 0.0
        stated = self._stated(cfg, query, walked)
        unnamed = sorted({end for e in stated if e[6] is None for end in (e[1], e[2])})
        found = await self._memories(cfg, query, ppr, unnamed, kept, assumed)
        if found is None:
            return None
        memories, names = found
        hits = above_share(self._facts(cfg, query, stated, ppr, names), share)
        hits += above_share(memories, share)
        return hits

    async def _current(self, tenant: str, assumed: Refresh) -> bool:
        """Whether the copy walked on assumption is current, when nothing else
        was read to carry its generation (no seed: nothing to score)."""
        current = assumed.unchanged(await current_generation(self._pool, tenant)) is not None
        self.cache.walks["unchanged"] += current
        return current

    async def _walk(
        self, cfg: BraidConfig, query: SearchQuery, *, assume: bool, changed: bool
    ) -> tuple[dict[int, float], Walked, tuple[TenantGraph, Overlay | None] | None, Refresh | None]:
        """The seeds (entity id -> weight) and the relations the walk reached,
        heaviest first: walked here from the tenant's relations kept in this
        process when the cache takes the recall (then also the copy walked,
        for the memory step), else by one statement. With ``assume``, a kept
        copy of a known generation is walked without reading anything, and
        returned last: its generation is the caller's to check. ``changed``:
        the generation is known to have moved, the changes are read at once."""
        seeded = query.vector is not None and cfg.graph.seed_limit > 0
        hops = cfg.graph.max_hops if query.hops is None else query.hops
        params: dict[str, Any] = {
            "tenant": query.tenant,
            "names": name_candidates(query.text),
            "hops": hops,
            "max_edges": cfg.graph.max_edges,
            "fanout": cfg.graph.fanout,
            "as_of": query.filters.as_of,
        }
        settings = None
        if seeded:
            tier = cfg.tiers[cfg.entity_tier]
            # The vector seeds' settings hold for this statement's transaction only.
            settings = search_settings(tier.ef_search)
            params.update(
                {
                    "vec": np.asarray(query.vector, dtype=np.float32),
                    "model": query.model,
                    "limit": cfg.graph.seed_limit,
                    "exact_below": tier.exact_below,
                    "min_similarity": cfg.graph.seed_min_similarity,
                }
            )
        refresh = None
        if query.filters.as_of is None and cfg.graph.fanout > 0:
            if (self.cache.limit, self.cache.total) != (cfg.graph.cache_rows, cfg.graph.cache_total_rows):
                self.cache.configure(cfg.graph.cache_rows, cfg.graph.cache_total_rows)
            refresh = self.cache.refresh(query.tenant)
            if refresh is not None and refresh.whole:
                # Read whole off this recall (its deadline is too short for a
                # large tenant); walked by the statement meanwhile.
                self._start_load(query.tenant, refresh)
                refresh = None
        if refresh is not None:
            now = time.time()
            taken: tuple[TenantGraph, Overlay | None] | None = None
            assumed = None
            if refresh.check() and not changed:
                if assume and refresh.assumable():
                    taken, assumed = refresh.assumed(), refresh
                else:
                    taken = refresh.unchanged(await current_generation(self._pool, query.tenant))
            unchanged = taken is not None and assumed is None
            if taken is None:
                taken = refresh.take(await tenant_reads(self._pool, query.tenant, refresh.reads()))
            if taken is not None:
                graph, overlay = taken
                self.cache.walks["here"] += 1
                self.cache.walks["raced"] += overlay is not None
                self.cache.walks["unchanged"] += unchanged
                seeds = graph.seeds(
                    params["names"],
                    query.vector if seeded else None,
                    model=query.model,
                    limit=cfg.graph.seed_limit,
                    min_similarity=cfg.graph.seed_min_similarity,
                    overlay=overlay,
                )
                walked = graph.walked(
                    seeds,
                    hops=hops,
                    fanout=cfg.graph.fanout,
                    max_edges=cfg.graph.max_edges,
                    now=now,
                    overlay=overlay,
                )
                return seeds, walked, taken, assumed
        self.cache.walks["postgres"] += 1
        (rows,) = await tenant_reads(
            self._pool,
            query.tenant,
            [Read(_walk_sql(seeded, query.filters.as_of is not None, cfg.graph.fanout > 0), params)],
            settings=settings,
        )
        seeds = {}
        edges = []
        for row in rows:
            if row[0] is None:
                seeds[row[1]] = row[5]
            else:
                edges.append(row)
        # In id order: PageRank's sums (and so exact ties) do not depend on the plan's row order.
        return dict(sorted(seeds.items())), Walked.of_rows(edges), None, None

    def _stated(self, cfg: BraidConfig, query: SearchQuery, walked: Walked) -> list[_Edge]:
        """The walked relations a client wrote, when the recall's filters let facts in."""
        f = query.filters
        # Facts have no session, tags, metadata, importance or memory tier: a
        # filter on those excludes them.
        if f.session_id is not None or f.tags or f.metadata or f.min_importance is not None:
            return []
        if f.kinds is not None and FACT_KIND not in f.kinds:
            return []
        if f.tiers is not None and cfg.entity_tier not in f.tiers:
            return []
        return walked.edges(stated=True)

    def _facts(
        self,
        cfg: BraidConfig,
        query: SearchQuery,
        stated: list[_Edge],
        ppr: dict[int, float],
        names: dict[int, str],
    ) -> list[Hit]:
        f = query.filters
        hits = []
        for rel_id, source_id, target_id, relation, weight, seconds, source, target, _ in stated:
            created = _instant(rel_id, seconds)
            if created is None:
                continue
            if f.created_after is not None and created < f.created_after:
                continue
            if f.created_before is not None and created > f.created_before:
                continue
            source = source if source is not None else names.get(source_id)
            target = target if target is not None else names.get(target_id)
            if source is None or target is None:
                # An end deleted since the walk read it (its relations went with it).
                continue
            hits.append(
                Hit(
                    id=f"rel:{rel_id}",
                    content=fact_sentence(source, relation, target),
                    kind=FACT_KIND,
                    tier=cfg.entity_tier,
                    created_at=created,
                    confidence=1.0,
                    score=weight * (ppr.get(source_id, 0.0) + ppr.get(target_id, 0.0)),
                )
            )
        return hits

    async def _memories(
        self,
        cfg: BraidConfig,
        query: SearchQuery,
        ppr: dict[int, float],
        unnamed: list[int],
        kept: tuple[TenantGraph, Overlay | None] | None,
        assumed: Refresh | None = None,
    ) -> tuple[list[Hit], dict[int, str]] | None:
        """The memories the reached entities pass their PageRank to, and the
        names of the entities ``unnamed``, in one round trip. Scored here from
        the tenant's mentions kept in this process when the walk was
        (``kept``) and the recall has no request filters, else by one
        statement. ``assumed``: the copy walked is taken to be current, and
        its generation is read in the same round trip; None when it was not."""
        if not ppr:
            if assumed is not None and not await self._current(query.tenant, assumed):
                return None
            return [], {}
        if kept is not None and query.filters == Filters():
            graph, overlay = kept
            scores = graph.shares(ppr, cfg.graph.mentions_per_entity, overlay)
            return await self._ranked_memories(cfg, query, scores, unnamed, assumed)
        assert assumed is None, "a copy is walked on assumption only for a recall without request filters"
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
                "scores": list(ppr.values()),
                "limit": query.limit,
                "per_entity": cfg.graph.mentions_per_entity,
            }
        )
        reads = [Read(_memories_sql(query.filters, where), params, dict_row)]
        if unnamed:
            reads.append(Read(_NAMES_SQL, {"tenant": query.tenant, "ids": unnamed}))
        rows, *named = await tenant_reads(self._pool, query.tenant, reads)
        names = {row[0]: row[1] for row in named[0]} if named else {}
        return [hit_from_row(r, float(r["score"])) for r in rows], names

    async def _ranked_memories(
        self,
        cfg: BraidConfig,
        query: SearchQuery,
        scores: Shares,
        unnamed: list[int],
        assumed: Refresh | None = None,
    ) -> tuple[list[Hit], dict[int, str]] | None:
        """The first ``query.limit`` of the memories ``scores`` ranks (best
        first, ties by id) that are current and pass the recall's lifecycle
        rules, read a slice of candidates at a time (the first with the names
        of ``unnamed``, and the tenant's generation when the copy scored is
        ``assumed`` current: None when it was not)."""
        where, params = filter_clause(
            query.filters,
            min_confidence=query.min_confidence,
            memory_tiers=cfg.memory_tiers,
            forgetting=Forgetting.from_config(cfg),
        )
        params["tenant"] = query.tenant
        sql = by_ids_sql(HIT_COLUMNS, where)
        step = query.limit + max(query.limit // 4, _RANKED_MARGIN)
        ranked = best(scores, step)
        hits: list[Hit] = []
        names: dict[int, str] = {}
        start = 0
        while True:
            part = ranked[start : start + step]
            reads = [Read(sql, {**params, "ids": TextArray(mid for mid, _ in part)}, dict_row)]
            if start == 0:
                if unnamed:
                    reads.append(Read(_NAMES_SQL, {"tenant": query.tenant, "ids": unnamed}))
                if assumed is not None:
                    # First: the statements after it see every change it saw.
                    reads.insert(0, Read(GENERATION_SQL, {"tenant": query.tenant}))
            results = await tenant_reads(self._pool, query.tenant, reads)
            if start == 0 and assumed is not None:
                ((generation,),), *results = results
                if assumed.unchanged(generation) is None:
                    return None
                self.cache.walks["unchanged"] += 1
            rows, *named = results
            if named:
                names = {row[0]: row[1] for row in named[0]}
            found = {r["id"]: r for r in rows}
            hits += [hit_from_row(found[mid], score) for mid, score in part if mid in found]
            start += len(part)
            if len(hits) >= query.limit or start >= len(scores):
                return hits[: query.limit], names
            if start >= len(ranked):
                # Rarely: the best candidates did not pass. The rest, in order (the same first ones).
                ranked = best(scores, len(scores))


#: Candidates a ranked read asks Postgres about beyond the limit (or a
#: quarter of it, when more): nearly all pass the lifecycle rules, and each
#: row read costs Postgres and this process a row (2 x limit, as before,
#: read 100 rows for a fused recall's 50).
_RANKED_MARGIN = 8


def _memories_sql(filters: Filters, where: str) -> str:
    """The memories that mention the entities ``%(eids)s`` scored ``%(scores)s``,
    best first, at most ``%(limit)s``, with their ``score``."""
    return f"""
        -- An entity passes its PPR mass on to the memories that mention
        -- it, split evenly among all of them (one more step of the walk)...
        WITH s AS (
            -- (An entity no memory names has no degree row, and nothing to pass on.)
            SELECT d.entity_id, s.score / greatest(d.mention_count, 1) AS share
            FROM unnest(%(eids)s::bigint[], %(scores)s::float8[]) AS s(entity_id, score)
            JOIN entity_degrees d ON d.entity_id = s.entity_id AND d.tenant = %(tenant)s
        ),
        -- ...of which only the newest few are read.
        linked AS (
            SELECT mn.memory_id, s.entity_id, s.share
            FROM s CROSS JOIN LATERAL ({_capped_mentions(filters, where)}) mn
        ),
        ranked AS (
            -- Summed in one order: memories naming the same entities tie
            -- exactly (then by id), whatever plan Postgres picks.
            SELECT memory_id, sum(share ORDER BY entity_id) AS score FROM linked GROUP BY memory_id
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
        """


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
