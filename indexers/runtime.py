"""Opening and closing everything the engine needs, in order.

``open_runtime`` connects to Postgres (migrating its schema), makes sure the
HNSW indexes and the Typesense collection exist, opens the embedder (the
local model or a hosted one, ``embedding.provider``) and loads the entity
extractor ``graph.extract`` names,
starts the outbox worker and the sweeper, and yields a :class:`Runtime`. On exit it stops
the worker and closes every pool and client. With a streaming replica
(``postgres.replicaDsn``) it opens a second pool on it, without waiting for it,
and the Postgres sources a second time on that pool: recalls read them once
the replica has replayed the tenant's writes (:mod:`indexers.postgres.replica`);
everything else (writes, the outbox worker, reindex, the sweeper) stays on the primary.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import msgspec
from psycopg_pool import AsyncConnectionPool

from config import ConfigHolder

from .base import SourceUnavailable
from .bookkeeping import Bookkeeper
from .embedders import open_embedder
from .embedding import Embedder
from .engine import Engine, ReplicaReads
from .extraction import Extractors
from .pgvector import ensure_indexes
from .placement import PlacementWatcher
from .postgres import (
    PostgresStore,
    ReplicaRouter,
    end_given_up,
    open_pool,
    open_replica_pool,
    primary_lsn,
    schema_lock,
)
from .registry import SourceDeps, SourceSpec, build_sources, registered
from .reindex import ReindexBusy, ReindexJobs
from .sweep import Sweeper
from .sync import OutboxSync, TermKeyRewrite
from .typesense import TypesenseClient, TypesenseGroups
from .typesense.placement import Placements

__all__ = ["Backends", "Runtime", "open_runtime"]

log = logging.getLogger("braid")


class Backends(msgspec.Struct, frozen=True):
    """Where the stores are, once resolved (embedded or external)."""

    postgres_dsn: str
    typesense_nodes: tuple[str, ...]
    typesense_api_key: str
    #: A streaming replica of ``postgres_dsn`` that recalls read (``postgres.replicaDsn``).
    postgres_replica_dsn: str | None = None
    #: Further Typesense clusters (``typesense.clusters``): each one's node URLs and API key.
    typesense_clusters: tuple[tuple[tuple[str, ...], str], ...] = ()


class Runtime(msgspec.Struct):
    engine: Engine
    store: PostgresStore
    typesense: TypesenseClient
    index: TypesenseGroups
    sync: OutboxSync
    jobs: ReindexJobs
    embedder: Embedder
    bookkeeper: Bookkeeper
    #: Removes expired memories (lifecycle.sweepIntervalS).
    sweeper: Sweeper
    #: The registered sources' specs (store, capabilities), by name.
    specs: dict[str, SourceSpec]


async def _check_model(store: PostgresStore, model: str) -> None:
    """Every stored vector records its model; warn when the service's model
    changed (vector search then leaves the older model's memories out until
    ``POST /admin/reindex {"target": "embeddings"}`` embeds them again)."""
    async with store.pool.connection() as conn:
        await conn.execute(
            "INSERT INTO braid_meta (key, value) VALUES ('embedding_model', %s) ON CONFLICT (key) DO NOTHING",
            (model,),
        )
        cur = await conn.execute("SELECT value FROM braid_meta WHERE key = 'embedding_model'")
        row = await cur.fetchone()
    if row is not None and row[0] != model:
        log.warning(
            "the database was created with %s but the service now embeds with %s: vector search "
            "leaves out memories of other models until they are embedded again "
            '(POST /admin/reindex {"target": "embeddings"}; GET /admin/stats counts them)',
            row[0],
            model,
        )


@asynccontextmanager
async def open_runtime(
    config: ConfigHolder,
    backends: Backends,
    *,
    embedder: Embedder | None = None,
    source_names: Sequence[str] | None = None,
) -> AsyncIterator[Runtime]:
    if embedder is None:
        # embedding.provider's embedder (indexers.embedders), open while the runtime is.
        async with (
            open_embedder(config.current.embedding) as model,
            _open_runtime(config, backends, model, source_names) as runtime,
        ):
            yield runtime
    else:
        async with _open_runtime(config, backends, embedder, source_names) as runtime:
            yield runtime


@asynccontextmanager
async def _open_runtime(
    config: ConfigHolder, backends: Backends, embedder: Embedder, source_names: Sequence[str] | None
) -> AsyncIterator[Runtime]:
    cfg = config.current
    if embedder.dim != cfg.embedding.dim:
        raise ValueError(f"embedding.dim is {cfg.embedding.dim} but {embedder.model} makes {embedder.dim}-d vectors")

    pool = await open_pool(
        backends.postgres_dsn,
        dim=cfg.embedding.dim,
        min_size=cfg.postgres.pool_min,
        max_size=cfg.postgres.pool_max,
    )
    store = PostgresStore(pool)
    replica_pool = None
    if backends.postgres_replica_dsn is not None:
        replica_pool = await open_replica_pool(
            backends.postgres_replica_dsn, min_size=cfg.postgres.pool_min, max_size=cfg.postgres.pool_max
        )
    client = TypesenseClient(
        backends.typesense_nodes,
        backends.typesense_api_key,
        timeout=cfg.typesense.timeout_ms / 1000.0,
    )
    clusters = [
        TypesenseClient(nodes, key, timeout=cfg.typesense.timeout_ms / 1000.0)
        for nodes, key in backends.typesense_clusters
    ]
    try:
        await _check_model(store, embedder.model)
        created = await ensure_indexes(pool, cfg)
        if created:
            log.info("created HNSW indexes %s", created)
        # The tenants moved to Typesense pairs of their own, read before the
        # first search; refreshed by a task below.
        watcher = PlacementWatcher(pool, Placements())
        await watcher.refresh()
        index = TypesenseGroups(
            client,
            cfg.typesense.collection,
            cfg.embedding.dim,
            groups=cfg.typesense.groups,
            vectors=cfg.typesense.vectors == "separate",
            stems=cfg.typesense.stems,
            placements=watcher.placements,
            clusters=clusters,
        )
        made: list[str] = []
        try:
            # Under the schema lock: processes starting at once on one database
            # (server.workers, pods) would each make a collection and point the
            # alias at theirs, the last one winning.
            async with schema_lock(pool):
                made = await index.ensure()
        except SourceUnavailable as exc:
            # Postgres is the truth: Braid starts and serves without Typesense,
            # and the outbox fills it in when it is back.
            log.warning("Typesense not reachable at start-up: %s", exc)

        # Whether keyword documents from before migration 26 may remain (the
        # outbox worker clears it once its rewrite is done).
        rewrite = TermKeyRewrite()
        await rewrite.check(pool)
        # Every registered source (or those named), built from the runtime's parts.
        sources = build_sources(
            SourceDeps(
                pool=pool, typesense=client, get_config=config, typesense_route=index.route, term_key_rewrite=rewrite
            ),
            source_names,
        )
        replica = None
        if replica_pool is not None:
            # The Postgres sources again, on the replica's pool; the others are shared.
            specs = registered()
            on_postgres = [n for n in sources if n in specs and specs[n].store == "postgres"]
            rebuilt = build_sources(
                SourceDeps(
                    pool=replica_pool,
                    typesense=client,
                    get_config=config,
                    typesense_route=index.route,
                    term_key_rewrite=rewrite,
                ),
                on_postgres,
            )
            router = ReplicaRouter(replica_pool, pool)
            # Writes made before this start (the last run's, whose positions it kept) are waited for too.
            router.wrote_before(await primary_lsn(pool))
            replica = ReplicaReads(
                router=router,
                store=PostgresStore(replica_pool),
                sources={n: rebuilt.get(n, source) for n, source in sources.items()},
            )
        bookkeeper = Bookkeeper(
            pool,
            queue_size=cfg.bookkeeping.queue_size,
            batch_size=cfg.bookkeeping.batch_size,
            flush_ms=cfg.bookkeeping.flush_ms,
        )
        extractors = Extractors()
        extractor = extractors.get(cfg.graph.extract)
        if extractor is not None:
            # Loaded now (about a second), not on a client's first write.
            await anyio.to_thread.run_sync(extractor.load)
        engine = Engine(config, store, sources, embedder, bookkeeper, extractors, replica)
        sync = OutboxSync(
            store,
            index,
            dsn=backends.postgres_dsn,
            batch_size=cfg.sync.batch_size,
            max_retry_ms=cfg.sync.max_retry_ms,
            workers=cfg.sync.workers,
            rewrite=rewrite,
        )
        async with anyio.create_task_group() as tg:

            def spawn(job: Callable[[], Coroutine[Any, Any, None]]) -> None:
                tg.start_soon(job)

            jobs = ReindexJobs(config, store, index, sync, spawn, embedder, extractors, watcher)
            await jobs.mark_interrupted()
            if made:
                await _fill_new_groups(pool, jobs, made)
            tg.start_soon(sync.run)
            tg.start_soon(watcher.run)
            # Decayed tiers' folds re-centred before their float range ends.
            tg.start_soon(jobs.watch_folds)
            tg.start_soon(bookkeeper.run)
            sweeper = Sweeper(store, config)
            tg.start_soon(sweeper.run)
            if replica is not None:
                tg.start_soon(replica.router.run)
            try:
                yield Runtime(
                    engine=engine,
                    store=store,
                    typesense=client,
                    index=index,
                    sync=sync,
                    jobs=jobs,
                    embedder=embedder,
                    bookkeeper=bookkeeper,
                    sweeper=sweeper,
                    specs=registered(),
                )
            finally:
                with anyio.CancelScope(shield=True):
                    # The outbox's batch in hand is finished, not cut in the middle of its import.
                    await sync.stop()
                tg.cancel_scope.cancel()
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(extractors.close)
                    # Work a source left running (the graph's first reads) ends before the pools close.
                    for source in {*sources.values(), *(replica.sources.values() if replica else ())}:
                        await source.aclose()
    finally:
        await client.aclose()
        for cluster in clusters:
            await cluster.aclose()
        # Reads whose recalls stopped waiting end first: the pools' close waits for their connections.
        if replica_pool is not None:
            await end_given_up(replica_pool)
            await replica_pool.close()
        await end_given_up(pool)
        await pool.close()


async def _fill_new_groups(pool: AsyncConnectionPool, jobs: ReindexJobs, made: Sequence[str]) -> None:
    """Typesense collections made at this start are empty: when Postgres
    holds memories (Typesense's data was lost, or ``typesense.groups``
    changed), a Typesense reindex job fills them (none if one runs already)."""
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT EXISTS (SELECT 1 FROM memories)")
        row = await cur.fetchone()
    if row is None or not row[0]:
        return
    try:
        job_id = await jobs.start("typesense", None)
    except ReindexBusy as exc:
        log.warning(
            "Typesense collections %s are new and empty; reindex job %s runs already", ", ".join(made), exc.job_id
        )
        return
    log.warning(
        "Typesense collections %s are new and empty while Postgres holds memories: reindex job %s fills them",
        ", ".join(made),
        job_id,
    )
