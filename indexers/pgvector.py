"""pgvector: one HNSW collection per tier, each with its own m / ef settings.

Memory tiers are partial HNSW indexes on ``memories`` (``WHERE tier = '<t>'``),
the entity tier is the HNSW index on ``entities``. A search sets
``hnsw.ef_search`` from the tier's config for that query only (``efSearch``,
or the ``efSearchAt`` step for the index's size), and turns on
pgvector 0.8's iterative index scan so that a selective filter (tenant,
session, tags, time) still returns ``limit`` rows when enough rows match.

Whether the index or an exact scan answers is decided in the statement, not
left to the planner: a bounded count of the rows the filter matches (at most
the tier's ``exactBelow`` + 1, read from a btree) picks an exact distance sort
for a small match set, the HNSW index otherwise, whatever the table's
statistics say (why: docs/design.md, "Postgres"). A count above
``exactBelow`` is remembered for :data:`WALK_MEMORY_S` for the searches
without request filters: they walk the index without counting meanwhile.
All the tiers of a search go to Postgres in one round trip. A tenant with
an index of its own in a tier (:mod:`indexers.own_index`) is named in the
text of that tier's statements, so the planner can walk that index.

A tier with a fold (``objective: decayed``, :mod:`indexers.postgres.fold`)
ranks by ``cosine x importance weight x exp(-lambda * age)`` instead: one
inner-product HNSW index on ``folded`` per epoch of the fold, ``folded <#> q``
in both branches, and the hit's score is that objective at the query's
``reference_time``. What a tier ranks by is what Postgres records
(``fold_epochs``), read in the search's own snapshot; the config's
``objective`` and ``halfLifeDays`` apply when the tier is created and through
:func:`rebuild_index` (a reindex of the tier).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from time import monotonic
from typing import Any, NamedTuple

import numpy as np
import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from config import BraidConfig, PgvectorSourceConfig, TierConfig, is_safe_name

from .base import Filters, Hit, SearchQuery, SourceUnavailable
from .lifecycle import Forgetting
from .own_index import REFRESH_S as OWN_INDEXES_S
from .own_index import (
    OwnIndexes,
    drop_own_indexes,
    own_index_ddl,
    own_index_name,
    read_own_indexes,
    tenant_sql,
    tier_builds,
)
from .postgres import (
    HIT_COLUMNS,
    PoolSource,
    Read,
    filter_clause,
    hit_from_row,
    schema_lock,
    settings_read,
    tenant_reads,
)
from .postgres.fold import (
    EPOCHS_SQL,
    NEUTRAL_IMPORTANCE,
    RECENTRE_EXPONENT,
    Epoch,
    delete_epochs,
    epochs_from_rows,
    fold_index_ddl,
    fold_index_name,
    move_rows,
    open_epoch,
    read_epochs,
    retire_older,
)
from .postgres.sql import build_memory, tier_hnsw_ddl
from .registry import register

__all__ = [
    "PgvectorSource",
    "ensure_indexes",
    "index_ddl",
    "index_name",
    "index_params",
    "nearest_sql",
    "rebuild_index",
    "refold_needed",
    "search_plans",
    "search_settings",
    "search_settings_read",
    "set_search_params",
    "similarity_floor",
    "SearchPlan",
    "WALK_AHEAD",
    "WALK_MEMORY_S",
]

log = logging.getLogger("braid.pgvector")

# Rows an iterative scan may visit before it gives up (pgvector's default is 20000).
MAX_SCAN_TUPLES = 40000

#: A folded tier's search whose ``created_before`` leaves out at least this
#: many of the tenant's newer rows compares its rows exactly: the index walk
#: meets those newer, larger rows first and would spend its
#: ``MAX_SCAN_TUPLES`` on them (at 100k memories, a filter keeping the oldest
#: 18% came back empty from the walk every time, after 110 ms).
WALK_AHEAD = MAX_SCAN_TUPLES // 2


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


def index_ddl(tier: str, cfg: BraidConfig, name: str, *, concurrently: bool) -> str:
    """The cosine HNSW index of ``tier`` (``embedding``, the tier's m /
    ef_construction), named ``name``: of a memory tier, its rows not flagged
    ``own`` (a tenant with an index of its own there, :mod:`indexers.own_index`,
    or a small one); of the entity tier, the entities not flagged ``small``
    (:mod:`indexers.postgres.unshared`)."""
    t: TierConfig = cfg.tiers[tier]
    if tier == cfg.entity_tier:
        conc = "CONCURRENTLY " if concurrently else ""
        with_ = f"WITH (m = {int(t.m)}, ef_construction = {int(t.ef_construction)})"
        return (
            f"CREATE INDEX {conc}IF NOT EXISTS {name} ON entities USING hnsw (embedding vector_cosine_ops) {with_}"
            " WHERE NOT small"
        )
    return tier_hnsw_ddl(tier, t, name, "embedding vector_cosine_ops", "NOT own", concurrently=concurrently)


async def _index_exists(conn: psycopg.AsyncConnection, name: str) -> bool:
    cur = await conn.execute("SELECT to_regclass(%s)", (name,))
    row = await cur.fetchone()
    return row is not None and row[0] is not None


async def _holds_rows(conn: psycopg.AsyncConnection, tier: str) -> bool:
    cur = await conn.execute("SELECT EXISTS (SELECT 1 FROM memories WHERE tier = %s)", (tier,))
    row = await cur.fetchone()
    return bool(row and row[0])


async def ensure_indexes(pool: AsyncConnectionPool, cfg: BraidConfig) -> list[str]:
    """Create each tier's HNSW index if it is missing; return the ones created.

    A tier ranked by similarity has a cosine index on ``embedding``; a tier
    with a fold, an inner-product index on ``folded`` per epoch. A tier
    configured ``decayed`` that holds no memory yet gets its fold here: its
    half-life and anchor are recorded now. One that already holds memories
    keeps ranking as Postgres records until a reindex of the tier (logged).
    Under :data:`~indexers.migrations.SCHEMA_LOCK`: service processes
    starting at once on one database (``server.workers``, pods) take turns,
    and each finds what the one before created.
    """
    created: list[str] = []
    async with schema_lock(pool) as conn:
        await _ensure_indexes(conn, cfg, created)
    return created


async def _ensure_indexes(conn: psycopg.AsyncConnection, cfg: BraidConfig, created: list[str]) -> None:
    """:func:`ensure_indexes`' work, on ``conn`` holding the lock; the names created go to ``created``."""
    epochs = await read_epochs(conn)
    for tier, t in cfg.tiers.items():
        live = epochs.get(tier, [])
        if t.objective == "decayed" and not live and not await _holds_rows(conn, tier):
            live = [await open_epoch(conn, tier, t.half_life_days, filling=False, only_if_none=True)]
        wanted = [
            (
                fold_index_name(tier, e.epoch),
                fold_index_ddl(tier, e.epoch, t, fold_index_name(tier, e.epoch), concurrently=False),
            )
            for e in live
        ]
        if not live or live[0].filling:
            name = index_name(tier, cfg)
            wanted.append((name, index_ddl(tier, cfg, name, concurrently=False)))
        for name, ddl in wanted:
            if await _index_exists(conn, name):
                continue
            async with build_memory(conn, cfg.postgres.index_build_memory_mb):
                await conn.execute(ddl)
            created.append(name)
        _log_pending(tier, t, live)


def _log_pending(tier: str, t: TierConfig, live: list[Epoch]) -> None:
    """Say when the config asks for something only a reindex of the tier does."""
    how = f'POST /admin/reindex {{"target": "pgvector", "tier": "{tier}"}} applies it'
    if live and (len(live) > 1 or live[-1].filling):
        log.warning("tier %s: a reindex left its fold unfinished (epochs %s); %s", tier, [e.epoch for e in live], how)
    elif t.objective == "decayed" and not live:
        log.warning("tier %s is configured `decayed` but its memories are ranked by similarity; %s", tier, how)
    elif t.objective == "similarity" and live:
        log.warning("tier %s is configured `similarity` but its memories are folded (decayed); %s", tier, how)
    elif live and live[-1].half_life_days != t.half_life_days:
        log.warning(
            "tier %s was folded with halfLifeDays %g, the config says %g; %s",
            tier,
            live[-1].half_life_days,
            t.half_life_days,
            how,
        )


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


Progress = Callable[[dict[str, object]], None]


async def rebuild_index(
    pool: AsyncConnectionPool,
    cfg: BraidConfig,
    tier: str,
    progress: Progress | None = None,
    *,
    recentre: bool = False,
) -> None:
    """Rebuild a tier's index with its current m / ef_construction, online.

    The new index is built CONCURRENTLY beside the old one, which keeps
    serving searches; then the old one is dropped and the new one renamed.

    A memory tier whose config says ``decayed`` is folded instead
    (:func:`_refold`): with the recorded half-life and an anchor in range, its
    epoch's index is rebuilt as above; otherwise (a new half-life, the anchor
    due for re-centring or ``recentre``, an unfinished fold, a tier ranked by
    similarity until now) a new epoch is opened and the rows moved into it.
    A tier with a fold whose config says ``similarity`` gets its cosine
    index back, then loses the fold.
    """
    note = progress or (lambda _: None)
    if tier != cfg.entity_tier:
        async with pool.connection() as conn:
            live = (await read_epochs(conn)).get(tier, [])
        if cfg.tiers[tier].objective == "decayed":
            await _refold(pool, cfg, tier, live, note, recentre=recentre)
            # Its searches walk the fold's index now, never a cosine one.
            dropped = await drop_own_indexes(pool, tier)
            if dropped:
                note({"tier": tier, "phase": "done", "own_indexes_dropped": dropped})
            return
        if live:
            await _swap_in(
                pool, cfg, tier, index_name(tier, cfg), lambda n: index_ddl(tier, cfg, n, concurrently=True), note
            )
            async with pool.connection() as conn:
                retired = await delete_epochs(conn, tier)
            await _drop(pool, [fold_index_name(tier, e) for e in retired])
            return
    await _swap_in(pool, cfg, tier, index_name(tier, cfg), lambda n: index_ddl(tier, cfg, n, concurrently=True), note)
    if tier != cfg.entity_tier:
        await _rebuild_own(pool, cfg, tier, note)


async def _rebuild_own(pool: AsyncConnectionPool, cfg: BraidConfig, tier: str, note: Progress) -> None:
    """Rebuild each large tenant's own index of ``tier`` (:mod:`indexers.own_index`)
    as the tier's (one recorded but missing is built again)."""
    for name, quoted in await tier_builds(pool, tier):
        ddl = functools.partial(own_index_ddl, tier, cfg.tiers[tier], quoted, concurrently=True)
        await _swap_in(pool, cfg, tier, name, ddl, note)


async def _swap_in(
    pool: AsyncConnectionPool, cfg: BraidConfig, tier: str, name: str, ddl: Callable[[str], str], note: Progress
) -> None:
    """Build ``ddl`` as ``<name>_rebuild`` CONCURRENTLY, then put it in ``name``'s place."""
    tmp = f"{name}_rebuild"
    async with pool.connection() as conn:
        await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {tmp}")
        note({"tier": tier, "phase": "building", "index": name})
        # HNSW builds are much faster with room for the graph (64 MB: 60% slower at 100k).
        async with build_memory(conn, cfg.postgres.index_build_memory_mb):
            await conn.execute(ddl(tmp))
        await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
        await conn.execute(f"ALTER INDEX {tmp} RENAME TO {name}")
        note({"tier": tier, "phase": "done", "index": name})


async def _drop(pool: AsyncConnectionPool, names: list[str]) -> None:
    async with pool.connection() as conn:
        for name in names:
            await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")


def refold_needed(t: TierConfig, live: list[Epoch], now: datetime) -> bool:
    """Whether folding ``t`` takes a new epoch (rows moved) rather than a
    rebuild of its epoch's index: no fold yet, an unfinished one, another
    half-life, or the newest memories' exponent at :data:`RECENTRE_EXPONENT`."""
    if len(live) != 1 or live[0].filling:
        return True
    return live[0].half_life_days != t.half_life_days or live[0].exponent(now) >= RECENTRE_EXPONENT


async def _refold(
    pool: AsyncConnectionPool, cfg: BraidConfig, tier: str, live: list[Epoch], note: Progress, *, recentre: bool
) -> None:
    t = cfg.tiers[tier]
    if not recentre and not refold_needed(t, live, datetime.now(UTC)):
        e = live[0]
        await _swap_in(
            pool,
            cfg,
            tier,
            fold_index_name(tier, e.epoch),
            lambda n: fold_index_ddl(tier, e.epoch, t, n, concurrently=True),
            note,
        )
        return
    async with pool.connection() as conn:
        # From here every write of the tier folds with the new epoch.
        epoch = await open_epoch(conn, tier, t.half_life_days, filling=True)
        name = fold_index_name(tier, epoch.epoch)
        note({"tier": tier, "phase": "building", "index": name, "epoch": epoch.epoch})
        # Built empty (a heap scan), then filled row by row as rows move in:
        # searches find each moved row in it at once.
        await conn.execute(fold_index_ddl(tier, epoch.epoch, t, name, concurrently=True))
        moved = await move_rows(
            conn, epoch, lambda n: note({"tier": tier, "phase": "moving", "index": name, "moved": n})
        )
        retired = await retire_older(conn, epoch)
    # A tier ranked by similarity until now leaves its cosine index behind.
    await _drop(pool, [fold_index_name(tier, e) for e in retired] + [index_name(tier, cfg)])
    note({"tier": tier, "phase": "done", "index": name, "moved": moved, "retired": retired})


def search_settings(ef_search: int) -> dict[str, str]:
    """The transaction-local settings the statements of :func:`nearest_sql` run under.

    ``enable_sort`` off makes the planner take the HNSW index wherever the
    statement allows it (every other path needs a sort); the exact branch
    and the final ordering have no sort-free path, so they still sort.
    No parallel workers: for a big tenant the planner made the exact branch
    a parallel scan, and its workers were launched for every search although
    that branch ran on at most ``exactBelow`` rows or not at all (12-14 ms
    against 2 ms a tier search at 100k rows, docs/design.md). A prepared
    statement (psycopg prepares one from its fifth execution on a
    connection) runs its generic plan: the branch is chosen in the statement,
    not by the plan, and planning it again for every search cost Postgres
    more than the plan saved (docs/design.md).
    """
    return {
        "hnsw.ef_search": str(int(ef_search)),
        "hnsw.iterative_scan": "relaxed_order",
        "hnsw.max_scan_tuples": str(MAX_SCAN_TUPLES),
        "enable_sort": "off",
        "max_parallel_workers_per_gather": "0",
        "plan_cache_mode": "force_generic_plan",
    }


def search_settings_read(ef_search: int) -> Read:
    """:func:`search_settings` as one statement of a :func:`tenant_reads`
    batch: the statements after it in the transaction run under them, those
    before it do not."""
    return settings_read(search_settings(ef_search))


async def set_search_params(conn: psycopg.AsyncConnection, ef_search: int) -> None:
    """Set :func:`search_settings` for the rest of the current transaction."""
    read = search_settings_read(ef_search)
    await conn.execute(read.sql, read.params)


def nearest_sql(
    columns: str,
    table: str,
    where: str,
    embedding: str,
    op: str = "<=>",
    ahead: str | None = None,
    *,
    counted: bool = True,
    aside: str | None = None,
) -> str:
    """The ``%(limit)s`` rows of ``table`` matching ``where`` nearest to
    ``%(vec)s`` by cosine distance (or by ``op``: ``<#>``, negative inner
    product), as ``columns`` plus ``distance`` and ``exact``.

    The statement first counts the matching rows, stopping at
    ``%(exact_below)s`` + 1. At most ``exact_below`` rows: they are all
    compared (exact). More: the table's HNSW index is walked, unless
    ``ahead`` (the rows the walk would meet first and the filter rejects)
    holds at least ``%(walk_ahead)s`` rows, counted only then: exact too.
    A one-time filter runs only the chosen branch; ``exact`` (on every
    row) says which ran. Not ``counted``: the index is walked, nothing is
    counted (``ahead`` is not used). ``aside``: a boolean column of the rows
    the index leaves out (:func:`_walk_sql`). Run it under
    :func:`search_settings` (set in the same transaction).
    """
    if op not in ("<=>", "<#>"):
        raise ValueError(f"unknown distance operator {op!r}")
    distance = f"{embedding} {op} %(vec)s"
    if not counted:
        return f"""
        SELECT * FROM ({_walk_sql(columns, table, where, distance, aside)}) AS nearest
        ORDER BY distance, id
    """
    blocked = (
        ""
        if ahead is None
        else f" OR (SELECT count(*) FROM (SELECT 1 FROM {table} WHERE {ahead}"
        f" LIMIT %(walk_ahead)s) AS newer) >= %(walk_ahead)s"
    )
    return f"""
        WITH small AS MATERIALIZED (
            SELECT count(*) <= %(exact_below)s{blocked} AS exact
            FROM (SELECT 1 FROM {table} WHERE {where} LIMIT %(exact_below)s + 1) AS matching
        ), nearest AS MATERIALIZED (
            (SELECT {columns}, {distance} AS distance FROM {table}
             WHERE (SELECT exact FROM small) AND {where}
             ORDER BY ({distance}) + 0 LIMIT %(limit)s)
            UNION ALL
            {_walk_sql(columns, table, f"NOT (SELECT exact FROM small) AND {where}", distance, aside)}
        )
        SELECT nearest.*, (SELECT exact FROM small) AS exact FROM nearest ORDER BY distance, id
    """


def _walk_sql(columns: str, table: str, where: str, distance: str, aside: str | None = None) -> str:
    """The index walk of :func:`nearest_sql`: the ``%(limit)s`` rows matching
    ``where`` nearest by ``distance``, in parentheses.

    ``aside``: a boolean column true of the rows the walked index leaves out
    (``m.own``: the rows of a tenant with an index of its own, which the
    tier's shared index does not hold). The walk then reads the rows where
    it is false, and the ``%(limit)s`` nearest of those where it is true are
    found exactly beside it (a btree holds them: none, unless the caller did
    not know yet that the tenant has an index of its own), so up to twice
    ``limit`` rows come back, the nearest ``limit`` among them."""
    walk = f"(SELECT {columns}, {distance} AS distance FROM {table} WHERE {where}"
    if aside is None:
        return f"{walk} ORDER BY {distance} LIMIT %(limit)s)"
    return (
        f"{walk} AND NOT {aside} ORDER BY {distance} LIMIT %(limit)s)"
        f" UNION ALL {walk} AND {aside} ORDER BY ({distance}) + 0 LIMIT %(limit)s)"
    )


def merged_walk_sql(columns: str, table: str, wheres: Sequence[tuple[str, str | None]]) -> str:
    """The ``%(limit)s`` rows of ``table`` (alias ``m``) nearest to
    ``%(vec)s`` by cosine distance among those matching any of ``wheres``,
    each walked by its own index (one a tier: each ``where`` names its tier,
    so the planner takes the tier's partial HNSW index), as ``columns`` plus
    ``distance``.

    The walks are merged in distance order and read only as far as the
    merge needs: ``limit`` rows in all, where the walks one at a time
    (:func:`nearest_sql`, not counted) read ``limit`` rows each, most of
    them cut by the caller. Each where comes with its ``aside``
    (:func:`_walk_sql`). Run it under :func:`search_settings`; its
    ``hnsw.ef_search`` holds for every walk."""
    if not wheres:
        raise ValueError("no walk to merge")
    distance = "m.embedding <=> %(vec)s"
    walks = " UNION ALL ".join(_walk_sql(columns, table, where, distance, aside) for where, aside in wheres)
    return f"""
        SELECT * FROM ({walks}) AS nearest
        ORDER BY distance, id LIMIT %(limit)s
    """


def _cosine(row: dict[str, Any]) -> float:
    return 1.0 - float(row["distance"])


def _similarity(row: dict[str, Any]) -> float:
    """A folded row's cosine similarity to the query (its ``similarity`` column)."""
    return float(row["similarity"])


class SearchPlan(NamedTuple):
    """One statement of a tier search and how its rows' scores are made."""

    #: The statement with its bounded count (:func:`nearest_sql`).
    statement: str
    score: Callable[[dict[str, Any]], float]
    #: The same search walking the index without counting (None when a
    #: ``created_before`` makes the walk's rows ahead count).
    walk: str | None = None
    #: A row's cosine similarity to the query, whatever the score ranks by
    #: (what the source's floors compare).
    similarity: Callable[[dict[str, Any]], float] = _cosine
    #: The conditions the statement's rows meet.
    where: str = ""
    #: The rows its index walk leaves out and finds exactly (:func:`_walk_sql`).
    aside: str | None = None


#: The cosine similarity of a folded row, selected beside its objective.
_FOLDED_COLUMNS = f"{HIT_COLUMNS}, 1.0 - (m.embedding <=> %(vec)s) AS similarity"


def _decayed(scale: float) -> Callable[[dict[str, Any]], float]:
    def score(row: dict[str, Any]) -> float:
        return -float(row["distance"]) * scale

    return score


def _weight(importance: Any) -> float:
    return NEUTRAL_IMPORTANCE if importance is None else float(importance)


def search_plans(
    where: str, live: list[Epoch], reference: datetime, ahead: str | None = None, aside: str | None = None
) -> list[SearchPlan]:
    """The statements of one tier's search (``where`` holds its conditions).

    No fold: the cosine index, scored by cosine. A fold: each epoch's index,
    ``folded <#> q`` scored by ``-distance * exp(-λ(t_ref - anchor))``, which
    is ``cosine x w x exp(-λ age)``, so epochs merge on the objective. While
    the first epoch is still filling (the tier was ranked by similarity), the
    rows not moved yet come from the cosine index, scored by the same
    objective with the newest epoch's λ. ``ahead``: the conditions of the
    newer rows a ``created_before`` filter leaves out (see :data:`WALK_AHEAD`);
    ``aside``: the rows the walked indexes leave out (:func:`_walk_sql`).
    """

    def plan(
        score: Callable[[dict[str, Any]], float],
        where: str,
        embedding: str = "m.embedding",
        op: str = "<=>",
        behind: str | None = None,
        columns: str = HIT_COLUMNS,
        walkable: bool = True,
    ) -> SearchPlan:
        walk = None
        if walkable and ahead is None:
            walk = nearest_sql(columns, "memories m", where, embedding, op, counted=False, aside=aside)
        similarity = _cosine if op == "<=>" else _similarity
        return SearchPlan(
            nearest_sql(columns, "memories m", where, embedding, op, behind, aside=aside),
            score,
            walk,
            similarity,
            where,
            aside,
        )

    if not live:
        return [plan(_cosine, where)]
    plans = [
        plan(
            _decayed(e.scale(reference)),
            f"{where} AND m.fold_epoch = {int(e.epoch)}",
            "m.folded",
            "<#>",
            None if ahead is None else f"{ahead} AND m.fold_epoch = {int(e.epoch)}",
            columns=_FOLDED_COLUMNS,
        )
        for e in live
    ]
    if live[0].filling:
        rate = live[-1].rate
        numbers = ", ".join(str(int(e.epoch)) for e in live)

        def unfolded(row: dict[str, Any]) -> float:
            age = (reference - row["created_at"]).total_seconds()
            return _cosine(row) * _weight(row["fold_importance"]) * math.exp(min(-rate * age, 700.0))

        plans.append(
            plan(
                unfolded,
                f"{where} AND (m.fold_epoch IS NULL OR m.fold_epoch NOT IN ({numbers}))",
                columns=f"{HIT_COLUMNS}, m.importance AS fold_importance",
                # These rows leave as they are moved: always counted.
                walkable=False,
            )
        )
    return plans


def similarity_floor(similarities: Sequence[float], minimum: float | None, relative: float) -> float:
    """The least cosine similarity a hit needs to be returned: ``minimum``
    (``None``: -1, no floor), or ``relative`` times the best of
    ``similarities`` when that is higher (a share of a best hit that is
    itself no match, at or below 0, cuts nothing more).

    Without a floor a vector list holds every memory of a small tenant, and
    fusion then counts "listed by two sources" as agreement; the floor keeps
    a vector list to the memories that are near the query.
    """
    floor = -1.0 if minimum is None else minimum
    best = max(similarities, default=0.0)
    return max(floor, relative * best) if relative > 0 and best > 0 else floor


#: Searches a recall may start over because a tier's folds changed meanwhile.
_FOLD_TRIES = 3

#: How long a source remembers that a tenant's tier statement found more than
#: ``exactBelow`` matching rows, for searches without request filters: until
#: then they walk the index without counting (docs/design.md).
WALK_MEMORY_S = 10.0

#: Statements a source remembers that way (forgotten all at once past this).
_WALK_MEMORY_ENTRIES = 10_000

#: How long the tiers' index sizes (for ``efSearchAt``) are used before they are read again.
INDEX_ROWS_S = 60.0


class PgvectorSource(PoolSource):
    """Nearest memories over every memory tier allowed: by cosine distance, or
    by the decayed objective in a tier with a fold."""

    name = "pgvector"
    needs_vector = True

    def __init__(self, pool: AsyncConnectionPool, get_config: Callable[[], BraidConfig]) -> None:
        super().__init__(pool, get_config)
        #: The tiers' folds as the last search read them: the next one's statements follow them.
        self._folds: dict[str, list[Epoch]] = {}
        #: (statement, tenant, model, min_confidence) -> until when (monotonic)
        #: its count is known to exceed ``exactBelow`` (see :data:`WALK_MEMORY_S`).
        self._walks: dict[tuple[str, str, str, float], float] = {}
        #: Index name -> its row count as Postgres estimates it, for ``efSearchAt``.
        self._index_rows: dict[str, int] = {}
        #: Until when (monotonic) :attr:`_index_rows` is used as it is.
        self._index_rows_until = -math.inf
        #: The large tenants' own indexes as last read (:mod:`indexers.own_index`).
        self._own: OwnIndexes = {}
        #: Until when (monotonic) :attr:`_own` is used as it is.
        self._own_until = -math.inf

    async def search(self, query: SearchQuery) -> list[Hit]:
        """One round trip to Postgres as a rule (:meth:`_search_tiers`); once
        a minute one more, when a tier has ``efSearchAt`` steps."""
        if query.vector is None:
            return []
        cfg = self._get_config()
        tiers = [t for t in cfg.memory_tiers if query.filters.tiers is None or t in query.filters.tiers]
        if monotonic() > self._own_until:
            await self._read_own()
        if monotonic() > self._index_rows_until and any(cfg.tiers[t].ef_search_at for t in tiers):
            await self._read_index_rows(cfg)
        limit = max(query.limit, 1)
        vec = np.asarray(query.vector, dtype=np.float32)
        try:
            for _ in range(_FOLD_TRIES):
                guess = {t: self._folds.get(t, []) for t in tiers}
                rows, folds = await self._search_tiers(cfg, tiers, guess, query, vec, limit)
                self._folds = folds
                if {t: folds.get(t, []) for t in tiers} == guess:
                    break
            else:
                raise SourceUnavailable(self.name, f"the tiers' folds changed during each of {_FOLD_TRIES} searches")
        except psycopg.Error as exc:
            raise SourceUnavailable(self.name, str(exc).strip() or type(exc).__name__) from exc
        rows.sort(key=lambda r: (-r["score"], r["id"]))
        section = cfg.source(self.name)
        assert isinstance(section, PgvectorSourceConfig)
        if not query.floors:
            return [hit_from_row(r, r["score"]) for r in rows[:limit]]
        floor = similarity_floor([r["similarity"] for r in rows], section.min_similarity, section.relative_floor)
        return [hit_from_row(r, r["score"]) for r in rows if r["similarity"] >= floor][:limit]

    async def _search_tiers(
        self,
        cfg: BraidConfig,
        tiers: list[str],
        guess: dict[str, list[Epoch]],
        query: SearchQuery,
        vec: np.ndarray,
        limit: int,
    ) -> tuple[list[dict[str, Any]], dict[str, list[Epoch]]]:
        """Every tier's nearest rows, each with its ``score``, searched as if
        the tiers' folds were ``guess``, and the folds as they are: one round
        trip, one repeatable-read transaction (:func:`tenant_reads`: the
        folds read and every tier's statements, each tier's settings set
        before its statements; or, when the tiers can be, one statement that
        walks them all: :meth:`_merged`). The rows hold only when the folds read are
        ``guess``; the caller searches again otherwise (a reindex opened or
        retired an epoch since the folds were last read)."""
        reference = query.reference_time or datetime.now(UTC)
        searches: list[tuple[dict[str, str], list[SearchPlan], dict[str, Any]]] = []
        for tier in tiers:
            where, params = filter_clause(
                query.filters,
                min_confidence=query.min_confidence,
                memory_tiers=cfg.memory_tiers,
                tier=tier,
                forgetting=Forgetting.from_config(cfg),
            )
            t = cfg.tiers[tier]
            params.update(
                {
                    "tenant": query.tenant,
                    "vec": vec,
                    "model": query.model,
                    "limit": limit,
                    "exact_below": t.exact_below,
                }
            )
            ahead = None
            if query.filters.created_before is not None:
                params["walk_ahead"] = WALK_AHEAD
                ahead = f"m.tenant = %(tenant)s AND m.tier = '{tier}' AND m.created_at > %(f_before)s"
            # relaxed_order may return the index's rows slightly out of
            # order; the statement sorts them again.
            # Only vectors of the query's model are compared with it. A
            # tenant with an index of its own in the tier is named in the
            # text, so the planner can take that index (the same rows either
            # way). Any other walks the shared index, which leaves out the
            # rows flagged ``own``: those are compared exactly beside the walk
            # (none, unless the tenant got an index since it was last read).
            quoted = self._own.get((query.tenant, tier))
            where = f"m.tenant = {tenant_sql(quoted)} AND m.model = %(model)s AND {where}"
            aside = "m.own" if quoted is None else None
            wanted = search_settings(t.ef_search_for(self.tier_rows(tier, cfg, query.tenant)))
            searches.append((wanted, search_plans(where, guess.get(tier, []), reference, ahead, aside), params))
        reads = [Read(EPOCHS_SQL)]
        plans: list[SearchPlan | None] = [None]
        counted: list[tuple[str, str, str, float] | None] = [None]
        first: dict[str, str] | None = None  # the first statement's settings go with the tenant scope
        merged = self._merged(searches, query)
        if merged is not None:
            first, plan, params = merged
            reads.append(Read(plan.statement, params, dict_row))
            plans.append(plan)
            counted.append(None)
        settings: dict[str, str] | None = None
        per_tier = searches if merged is None else []
        for wanted, tier_plans, params in per_tier:
            if first is None:
                first = wanted
            elif wanted != settings:
                reads.append(settings_read(wanted))
                plans.append(None)
                counted.append(None)
            settings = wanted
            for plan in tier_plans:
                statement, key = self._statement(plan, query)
                reads.append(Read(statement, params, dict_row))
                plans.append(plan)
                counted.append(key)
        results = await tenant_reads(self._pool, query.tenant, reads, settings=first, repeatable_read=True)
        rows: list[dict[str, Any]] = []
        for found, made_by, key in zip(results[1:], plans[1:], counted[1:], strict=True):
            if made_by is None:
                continue
            if key is not None and found:
                self._remember(key, bool(found[0]["exact"]))
            for row in found:
                row["score"] = made_by.score(row)
                row["similarity"] = made_by.similarity(row)
                rows.append(row)
        return rows, epochs_from_rows(results[0])

    def _shared_names(self, tier: str, cfg: BraidConfig) -> list[str]:
        """The indexes of ``tier`` every tenant's search may walk: its cosine index and its folds' (as last read)."""
        return [index_name(tier, cfg), *(fold_index_name(tier, e.epoch) for e in self._folds.get(tier, []))]

    def _index_names(self, tier: str, cfg: BraidConfig) -> list[str]:
        """The indexes a search of ``tier`` may walk: the shared ones, then the tenants' own (as last read)."""
        return self._shared_names(tier, cfg) + [own_index_name(tier, tenant) for tenant, t in self._own if t == tier]

    def tier_rows(self, tier: str, cfg: BraidConfig, tenant: str | None = None) -> int:
        """The rows of the indexes a search of ``tier`` by ``tenant`` walks,
        as last read (0 before the first read): the tenant's own index, or the
        tier's shared ones."""
        if tenant is not None and (tenant, tier) in self._own:
            return self._index_rows.get(own_index_name(tier, tenant), 0)
        return sum(self._index_rows.get(name, 0) for name in self._shared_names(tier, cfg))

    async def _read_index_rows(self, cfg: BraidConfig) -> None:
        """Read the memory tiers' index sizes (``pg_class.reltuples``: set by
        the build, then by VACUUM and ANALYZE; -1, never counted, reads as 0).
        A failure keeps the sizes last read: a search goes on with them."""
        self._index_rows_until = monotonic() + INDEX_ROWS_S  # one reader at a time
        names = [n for tier in cfg.memory_tiers for n in self._index_names(tier, cfg)]
        try:
            async with self._pool.connection() as conn:
                cur = await conn.execute(
                    "SELECT relname, greatest(reltuples, 0)::bigint FROM pg_class WHERE relname = ANY(%s)", (names,)
                )
                self._index_rows = {name: int(rows) for name, rows in await cur.fetchall()}
        except psycopg.Error as exc:
            log.warning("index sizes not read (efSearchAt keeps the last ones): %s", exc)

    async def _read_own(self) -> None:
        """Read the large tenants' own indexes (``pgvector_own_indexes``). A
        failure keeps the ones last read: a search goes on with them."""
        self._own_until = monotonic() + OWN_INDEXES_S  # one reader at a time
        try:
            async with self._pool.connection() as conn:
                own = await read_own_indexes(conn)
        except psycopg.Error as exc:
            log.warning("own indexes not read (the last ones are used): %s", exc)
            return
        if own.keys() != self._own.keys():
            self._index_rows_until = -math.inf  # a new index's size, for efSearchAt
        self._own = own

    def _merged(
        self, searches: list[tuple[dict[str, str], list[SearchPlan], dict[str, Any]]], query: SearchQuery
    ) -> tuple[dict[str, str], SearchPlan, dict[str, Any]] | None:
        """The tiers' searches as one merged walk (:func:`merged_walk_sql`)
        with its settings, when they can be: more than one tier, each ranked
        by cosine (no fold) and known to walk its index (see
        :meth:`_statement`). Their rows are then cut to one list by the same
        score, so a tier's rows beyond the best ``limit`` of all would be read
        for nothing. Its ``efSearch`` is the largest of the tiers': every
        tier's walk is at least as wide as its own setting."""
        if len(searches) < 2 or any(len(tier_plans) != 1 for _, tier_plans, _ in searches):
            return None
        wheres = []
        for _, (plan,), _ in searches:
            if plan.score is not _cosine or self._statement(plan, query)[0] != plan.walk:
                return None
            wheres.append((plan.where, plan.aside))
        settings = max((wanted for wanted, _, _ in searches), key=lambda w: int(w["hnsw.ef_search"]))
        # Without request filters the tiers' parameters differ only in exact_below, which a walk does not use.
        params = searches[0][2]
        return settings, SearchPlan(merged_walk_sql(HIT_COLUMNS, "memories m", wheres), _cosine), params

    def _statement(self, plan: SearchPlan, query: SearchQuery) -> tuple[str, tuple[str, str, str, float] | None]:
        """The statement to run for ``plan``, and the key to remember its
        count's outcome by when it counts and may be remembered: a search
        without request filters walks the index at once while its statement
        is known to match more than ``exactBelow`` rows."""
        if plan.walk is None or query.filters != Filters():
            return plan.statement, None
        key = (plan.statement, query.tenant, query.model, query.min_confidence)
        if self._walks.get(key, 0.0) > monotonic():
            return plan.walk, None
        return plan.statement, key

    def _remember(self, key: tuple[str, str, str, float], exact: bool) -> None:
        if exact:
            self._walks.pop(key, None)
            return
        if len(self._walks) >= _WALK_MEMORY_ENTRIES:
            self._walks.clear()
        self._walks[key] = monotonic() + WALK_MEMORY_S


register(PgvectorSource.spec(covers_vectors=True, matches=frozenset({"vector"})))
