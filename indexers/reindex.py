"""Online reindex jobs: Typesense rebuilt from Postgres, pgvector HNSW rebuilt.

Jobs live in the ``reindex_jobs`` table, so any service process can report
them. While a job runs, recalls keep using the old index:

* **Typesense**: a new collection pair (keyword and vectors,
  :mod:`indexers.typesense.index`) for every tenant group
  (:mod:`indexers.typesense.groups`) is filled from a snapshot of Postgres,
  then every memory touched since shortly before the snapshot (read from the
  outbox, which keeps processed rows for an hour) is re-applied from its
  current row, each group's aliases are switched to its new pair, the
  replay is repeated for writes that raced the switch, and the old
  collections are dropped, with the groups of another group count (a
  changed ``typesense.groups``). A collection made by an older Braid
  (embeddings in its keyword documents, serving both aliases) is replaced
  so by the pair.
* **embeddings**: every memory and entity whose embedding another model
  made (vector search leaves them out) is embedded again by the service's
  model, ``EMBED_BATCH`` at a time on the embedder's write lane (a recall's
  query embedding never waits behind it), and each batch is written in one
  transaction with its outbox rows (:mod:`indexers.postgres.reembed`).
  Progress counts both kinds; a row re-written or deleted meanwhile is left
  as its writer left it.
* **graph**: entities and relations extracted again from every memory by
  the extractor ``graph.extract`` names (:mod:`indexers.reextract`).
* **placement**: first, every tenant with ``postgres.ownIndexAbove``
  memories or more in a memory tier given a HNSW index of its own there
  (:mod:`indexers.own_index`; progress under ``pgvector``: the indexes to
  build, ``done``/``total``, and those ``dropped``); then every tenant with
  ``typesense.ownCollectionAbove`` memories or more moved, one after the
  other, to a Typesense collection pair of its own (:mod:`indexers.placement`).
  Progress: the tenants moved of those found (``done``/``total``), and the
  current move's phase and memories copied (``current``).
* **import** (with ``tenant``): the tenant made ready for a bulk load: its
  own HNSW indexes reserved (:func:`indexers.own_index.reserve_own_indexes`:
  its writes insert into no HNSW index until the next ``placement`` job
  builds them in one pass each), then the tenant moved to a Typesense
  collection pair of its own. Progress under ``import``: the ``tenant``, the
  tiers ``reserved``, the move (``typesense``) and the ``phase``
  (``importing`` once done: load, then run a ``placement`` job).
* **pgvector**: each tier's HNSW index is rebuilt CONCURRENTLY with the
  tier's current m / ef_construction and swapped in. A decayed tier whose
  fold needs a new epoch (a new half-life, re-centring, a tier folded for the
  first time) has its rows moved into the new epoch instead
  (:func:`indexers.pgvector.rebuild_index`); :meth:`ReindexJobs.watch_folds`
  starts that job itself when a fold nears the end of its float range or a
  job left one unfinished.

Once a job that writes or deletes Typesense documents in bulk
(``typesense``, ``all``, ``placement``, ``import``) is done, every Typesense
node is asked to compact its store: 0.24.1 reads each hit's document up to
five times dearer until it has (progress under ``compact``: each node's
answer and the seconds; a node that refuses does not fail the job).

A job cut short by a crash is marked ``interrupted`` at the next start-up,
and a new job can run. The process running a job holds a Postgres advisory
lock for it (on a connection of its own, released when that process dies), so
a process starting up beside a live one leaves that one's job alone. What a Typesense job leaves behind is cleared then,
and again before every Typesense reindex (for a job that failed, or whose
clean-up found Typesense down): its progress names, for each group's alias,
the collection it was filling (``collections``) and the one the alias pointed
at before (``previous``), and the replay's start (a job of a Braid before
groups names one ``collection`` and one ``previous``, of the one alias). For
each group: if its alias was not switched yet, the old collection was never
touched and the new one is dropped; if it was, the replay is repeated into
the alias (the job may have died before its second replay) and the old
collection is dropped. Collections are named by their keyword collection:
its vectors collection goes with it.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from config import BraidError, ConfigHolder

from .base import BackendError, MemoryRecord, postgres_errors
from .embedding import Embedder
from .extraction import Extractors
from .own_index import place_indexes, reserve_own_indexes
from .pgvector import rebuild_index
from .placement import (
    PlacementWatcher,
    clear_group,
    move_tenant,
    moved_with_leftovers,
    read_placements,
    replay,
    tenants_to_move,
)
from .postgres import PostgresStore, entity_text
from .postgres.fold import RECENTRE_EXPONENT, read_epochs
from .postgres.reembed import (
    replace_entities,
    replace_memories,
    stale_counts,
    stale_entities,
    stale_memories,
)
from .reextract import reextract
from .snapshot import copy_snapshot
from .sync import OutboxSync
from .typesense import TypesenseGroups

__all__ = ["ReindexBusy", "ReindexJobs"]

log = logging.getLogger("braid.reindex")

#: Memories (or entities) re-embedded and written per step of an embeddings job.
EMBED_BATCH = 64

#: The jobs that write or delete Typesense documents in bulk, after which
#: every node is asked to compact its store (:meth:`ReindexJobs._compact`).
COMPACTING = frozenset({"typesense", "all", "placement", "import"})

#: Replay window before the snapshot: covers writes whose transactions were
#: open when the snapshot was taken.
REPLAY_MARGIN = timedelta(seconds=60)


#: How often :meth:`ReindexJobs.watch_folds` looks at the decayed tiers' folds.
FOLD_CHECK_S = 3600.0

#: The advisory lock a job's process holds while the job lives.
_JOB_LOCK = "hashtextextended('braid-reindex:' || %s, 0)"


class ReindexBusy(BraidError):
    """A reindex job is already queued or running."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"reindex job {job_id} is still running; wait for it (GET /admin/reindex/{job_id})")
        self.job_id = job_id


class ReindexJobs:
    def __init__(
        self,
        config: ConfigHolder,
        store: PostgresStore,
        index: TypesenseGroups,
        sync: OutboxSync,
        spawn: Callable[[Callable[[], Coroutine[Any, Any, None]]], None],
        embedder: Embedder | None = None,
        extractors: Extractors | None = None,
        placements: PlacementWatcher | None = None,
    ) -> None:
        self._config = config
        self._store = store
        self._index = index
        self._sync = sync
        self._spawn = spawn
        #: The service's model: what an ``embeddings`` job embeds with.
        self._embedder = embedder
        #: What a ``graph`` job extracts with (``graph.extract``).
        self._extractors = extractors
        #: This process' view of the moved tenants, refreshed by a ``placement`` job at each step.
        self._placements = placements

    async def mark_interrupted(self) -> int:
        """At start-up: a job left queued or running whose lock is free died
        with its process; mark it ``interrupted`` and clear what it left in
        Typesense. A job whose lock is held runs in another live process."""
        marked = 0
        async with self._store.pool.connection() as conn:
            cur = await conn.execute("SELECT id FROM reindex_jobs WHERE status IN ('queued', 'running')")
            for (job_id,) in await cur.fetchall():
                # Autocommit: the transaction lock is only a probe, released at once.
                probe = await conn.execute(f"SELECT pg_try_advisory_xact_lock({_JOB_LOCK})", (job_id,))
                row = await probe.fetchone()
                if row is None or not row[0]:
                    continue
                done = await conn.execute(
                    "UPDATE reindex_jobs SET status = 'interrupted', finished_at = clock_timestamp(),"
                    " error = 'the service stopped while the job ran'"
                    " WHERE id = %s AND status IN ('queued', 'running')",
                    (job_id,),
                )
                marked += done.rowcount
        await self.clear_leftovers()
        return marked

    async def clear_leftovers(self) -> list[str]:
        """Drop the collections of interrupted or failed Typesense jobs (see
        the module's docstring); returns the ids of the jobs cleared. A job
        whose clean-up fails (Typesense down) is tried again next time."""
        async with self._store.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT id, progress->'typesense' FROM reindex_jobs"
                " WHERE status IN ('interrupted', 'failed')"
                " AND progress->'typesense' ?| array['collection', 'collections']"
                " AND NOT progress->'typesense' ? 'cleared'"
                " ORDER BY created_at"
            )
            jobs = await cur.fetchall()
        cleared = []
        for job_id, progress in jobs:
            try:
                await self._clear(progress)
            except BackendError as exc:
                log.warning("reindex %s: its Typesense collection is not cleared yet: %s", job_id, exc)
                continue
            async with self._store.pool.connection() as conn:
                await conn.execute(
                    "UPDATE reindex_jobs SET progress = jsonb_set(progress, '{typesense,cleared}', 'true')"
                    " WHERE id = %s",
                    (job_id,),
                )
            cleared.append(job_id)
        return cleared

    async def _clear(self, progress: dict[str, Any]) -> None:
        news, previous = _job_collections(progress, self._index.alias)
        since = progress.get("since")
        for alias, new in news.items():
            index = self._index.index(alias)
            if await index.current_collection() != new:
                # Not switched: the alias still serves the old collection.
                await index.drop_collection(new)
                log.info("dropped %s, the collection of an unfinished reindex", new)
                continue
            # Switched: finish the job's work (the vectors alias, which is
            # switched second, its second replay and the drop).
            await index.switch_alias(new)
            if since is not None:
                await self._replay(datetime.fromisoformat(since), {alias: new})
            old = previous.get(alias)
            if old is not None and old != new:
                await index.drop_collection(old)
                log.info("dropped %s, replaced by the unfinished reindex's %s", old, new)

    async def start(self, target: str, tier: str | None, *, tenant: str | None = None) -> str:
        """Queue a job (``tenant``: an ``import`` job's); :class:`ReindexBusy`
        if one is queued or running (a unique index on the active jobs
        decides, across processes too)."""
        job_id = uuid.uuid4().hex
        with postgres_errors("write"):
            # Locked before the row exists: no process can see the job unlocked.
            lock = await self._store.pool.getconn()
            try:
                await lock.execute(f"SELECT pg_advisory_lock({_JOB_LOCK})", (job_id,))
                await lock.execute(
                    "INSERT INTO reindex_jobs (id, target, tier, status, progress) VALUES (%s, %s, %s, 'queued', %s)",
                    (job_id, target, tier, Jsonb({} if tenant is None else {"import": {"tenant": tenant}})),
                )
            except psycopg.errors.UniqueViolation:
                cur = await lock.execute("SELECT id FROM reindex_jobs WHERE status IN ('queued', 'running')")
                row = await cur.fetchone()
                await self._release(lock, job_id)
                raise ReindexBusy(row[0] if row else "") from None
            except BaseException:
                await self._release(lock, job_id)
                raise
        self._spawn(lambda: self._run(job_id, target, tier, lock, tenant))
        return job_id

    async def _release(self, lock: psycopg.AsyncConnection[Any], job_id: str) -> None:
        """Give the job's lock and its connection back (even while cancelled)."""
        with anyio.CancelScope(shield=True):
            try:
                await lock.execute(f"SELECT pg_advisory_unlock({_JOB_LOCK})", (job_id,))
            except psycopg.Error as exc:
                # A broken connection: its lock went with it, the pool drops it.
                log.info("reindex job %s: lock connection already broken (%s)", job_id, exc)
            await self._store.pool.putconn(lock)

    async def folds_due(self) -> list[str]:
        """The tiers configured ``decayed`` whose fold needs its reindex now:
        one a job left unfinished (several epochs, or one still filling), or
        whose newest memories' exponent reached ``RECENTRE_EXPONENT``."""
        cfg = self._config.current
        async with self._store.pool.connection() as conn:
            folds = await read_epochs(conn)
        now = datetime.now(UTC)
        return [
            tier
            for tier, live in folds.items()
            if tier in cfg.memory_tiers
            and cfg.tiers[tier].objective == "decayed"
            and (len(live) > 1 or live[-1].filling or live[-1].exponent(now) >= RECENTRE_EXPONENT)
        ]

    async def watch_folds(self, interval_s: float = FOLD_CHECK_S) -> None:
        """Forever: every ``interval_s``, start a pgvector reindex of the first
        tier :meth:`folds_due` names (one job at a time: a busy one waits for
        the next look)."""
        while True:
            try:
                due = await self.folds_due()
                if due:
                    job_id = await self.start("pgvector", due[0])
                    log.info("tier %s: its fold is re-centred or finished by reindex job %s", due[0], job_id)
            except ReindexBusy:
                pass
            except (psycopg.Error, BackendError) as exc:
                log.warning("fold check failed, next in %g s: %s", interval_s, exc)
            await anyio.sleep(interval_s)

    async def get(self, job_id: str) -> dict[str, Any] | None:
        with postgres_errors("read"):
            return await self._get(job_id)

    async def active(self) -> int:
        """Jobs queued or running now, in any process (0 or 1: one at a time)."""
        async with self._store.pool.connection() as conn:
            cur = await conn.execute("SELECT count(*) FROM reindex_jobs WHERE status IN ('queued', 'running')")
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def _get(self, job_id: str) -> dict[str, Any] | None:
        async with self._store.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(
                "SELECT id, target, tier, status, progress, error, created_at, finished_at"
                " FROM reindex_jobs WHERE id = %s",
                (job_id,),
            )
            return await cur.fetchone()

    async def _set(self, job_id: str, **fields: Any) -> None:
        sets = ", ".join(f"{k} = %({k})s" for k in fields)
        if "progress" in fields:
            fields["progress"] = Jsonb(fields["progress"])
        fields["id"] = job_id
        async with self._store.pool.connection() as conn:
            await conn.execute(f"UPDATE reindex_jobs SET {sets} WHERE id = %(id)s", fields)

    async def _run(
        self, job_id: str, target: str, tier: str | None, lock: psycopg.AsyncConnection[Any], tenant: str | None
    ) -> None:
        try:
            await self._run_locked(job_id, target, tier, tenant)
        finally:
            await self._release(lock, job_id)

    async def _run_locked(self, job_id: str, target: str, tier: str | None, tenant: str | None) -> None:
        progress: dict[str, Any] = {} if tenant is None else {"import": {"tenant": tenant}}

        async def report(update: dict[str, Any]) -> None:
            for key, value in update.items():
                progress.setdefault(key, {}).update(value)
            await self._set(job_id, progress=progress)

        await self._set(job_id, status="running")
        try:
            if target in ("pgvector", "all"):
                await self._pgvector(tier, report)
            if target in ("typesense", "all"):
                await self._typesense(report)
            if target == "embeddings":
                await self._embeddings(report)
            if target == "graph":
                await self._graph(report)
            if target == "placement":
                await self._placement(report)
            if target == "import":
                assert tenant is not None
                await self._import(tenant, report)
            if target in COMPACTING:
                await self._compact(report)
        except Exception as exc:  # the job's boundary: record the failure, never crash the app
            log.exception("reindex %s failed", job_id)
            await self._set(job_id, status="failed", error=str(exc) or type(exc).__name__)
            return
        await self._finish(job_id)

    async def _compact(self, report: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        """Every Typesense node asked to compact its store once the job's
        bulk writes and deletes are done (:meth:`TypesenseClient.compact`:
        until then 0.24.1 reads each hit dearer). Progress under ``compact``:
        each node's answer (``ok``, or why not) and the seconds taken. A node
        that refuses or fails does not fail the job: it compacts on its own,
        later."""
        started = time.monotonic()
        await report({"compact": {"phase": "compacting"}})
        nodes = await self._index.compact()
        seconds = round(time.monotonic() - started, 3)
        failed = {node: why for node, why in nodes.items() if why != "ok"}
        if failed:
            log.warning("typesense nodes did not compact their stores: %s", failed)
        await report({"compact": {"phase": "done", "nodes": nodes, "seconds": seconds}})

    async def _finish(self, job_id: str) -> None:
        """``done`` with its finishing time, in one statement: a reader never
        sees a job done without ``finished_at``."""
        async with self._store.pool.connection() as conn:
            await conn.execute(
                "UPDATE reindex_jobs SET status = 'done', finished_at = clock_timestamp() WHERE id = %s", (job_id,)
            )

    async def _pgvector(self, tier: str | None, report: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        cfg = self._config.current
        tiers = [tier] if tier is not None else list(cfg.tiers)
        for i, name in enumerate(tiers):
            await report({"pgvector": {"tier": name, "done": i, "total": len(tiers)}})
            await rebuild_index(self._store.pool, cfg, name)
        await report({"pgvector": {"done": len(tiers), "total": len(tiers)}})

    async def _embeddings(self, report: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        if self._embedder is None:
            raise RuntimeError("this service has no embedder to re-embed with")
        embedder, pool = self._embedder, self._store.pool
        model = embedder.model
        memories, entities = await stale_counts(pool, model)
        done = {"memories": 0, "entities": 0}

        async def step(kind: str, total: int, replaced: int, read: int) -> None:
            done[kind] += read
            progress = {"model": model, kind: {"done": done[kind], "total": total}}
            await report({"embeddings": progress})
            log.info("re-embedding %s: %d/%d read, %d replaced in this batch", kind, done[kind], total, replaced)

        await report(
            {
                "embeddings": {
                    "model": model,
                    "memories": {"done": 0, "total": memories},
                    "entities": {"done": 0, "total": entities},
                }
            }
        )
        after: tuple[str, str] | None = None
        while rows := await stale_memories(pool, model, after, EMBED_BATCH):
            vectors = await embedder.embed([r.content for r in rows])
            replaced = await replace_memories(pool, rows, vectors, model)
            after = (rows[-1].tenant, rows[-1].id)
            await step("memories", memories, replaced, len(rows))
        last: int | None = None
        while entity_rows := await stale_entities(pool, model, last, EMBED_BATCH):
            texts = [entity_text(e.name, e.summary) for e in entity_rows]
            replaced = await replace_entities(pool, entity_rows, await embedder.embed(texts), model)
            last = entity_rows[-1].id
            await step("entities", entities, replaced, len(entity_rows))

    async def _graph(self, report: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        cfg = self._config.current
        extractor = None if self._extractors is None else self._extractors.get(cfg.graph.extract)
        if extractor is None or self._embedder is None:
            raise RuntimeError("graph.extract is `none`: there is no extractor to extract with")
        await reextract(self._store, self._embedder, extractor, cfg, report)

    async def _placement(self, report: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        """Give every tenant at or over ``postgres.ownIndexAbove`` memories in
        a memory tier a HNSW index of its own there (:mod:`indexers.own_index`),
        then move every tenant at or over ``typesense.ownCollectionAbove``
        memories to a Typesense pair of its own (:mod:`indexers.placement`)."""
        if self._placements is None:
            raise RuntimeError("this service has no placement watcher")
        pool = self._store.pool
        await place_indexes(pool, self._config.current, report)
        threshold = self._config.current.typesense.own_collection_above
        movers = await tenants_to_move(pool, threshold)
        await report(
            {"placement": {"threshold": threshold, "tenants": [t for t, _ in movers], "done": 0, "total": len(movers)}}
        )
        for i, (tenant, _) in enumerate(movers):
            step = functools.partial(_merged, report, "placement", "current", {})
            await move_tenant(pool, self._index, self._sync, self._placements, tenant, step)
            await report({"placement": {"done": i + 1}})
        # Moves that failed while clearing their group, finished.
        cleared = {
            tenant: await clear_group(pool, self._index, tenant)
            for tenant in await moved_with_leftovers(pool, self._index)
        }
        if cleared:
            await report({"placement": {"cleared": cleared}})

    async def _import(self, tenant: str, report: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        """Make ``tenant`` ready for a bulk load: its own HNSW indexes
        reserved in every memory tier ranked by similarity (its writes insert
        into no HNSW index until the next ``placement`` job builds them in one
        pass each: :func:`~indexers.own_index.reserve_own_indexes`), then the
        tenant moved to a Typesense collection pair of its own (unless it is
        there already), so a load never fills a shared group to be copied
        out of it afterwards."""
        if self._placements is None:
            raise RuntimeError("this service has no placement watcher")
        pool = self._store.pool
        tiers = await reserve_own_indexes(pool, self._config.current, tenant)
        await report({"import": {"reserved": tiers, "phase": "moving"}})
        placed = await read_placements(pool)
        if tenant in placed and placed[tenant].state == "live":
            await report({"import": {"typesense": {"phase": "moved", "alias": placed[tenant].alias}}})
        else:
            step = functools.partial(_merged, report, "import", "typesense", {})
            await move_tenant(pool, self._index, self._sync, self._placements, tenant, step)
        await report({"import": {"phase": "importing"}})

    async def _typesense(self, report: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        await self.clear_leftovers()
        groups = self._index
        previous = await groups.current_collections()
        news: dict[str, str] = {}
        # Recorded as each pair is made: a crash from here on leaves them to
        # clear_leftovers.
        for alias in groups.aliases():
            news[alias] = await groups.index(alias).new_collection()
            await report({"typesense": {"collections": news, "previous": previous, "phase": "creating"}})
        await report({"typesense": {"phase": "copying", "done": 0}})

        async def write(records: list[MemoryRecord]) -> None:
            # Each memory once into a collection nothing else writes to yet:
            # one import request a batch is safe in 0.24.1.
            await groups.upsert(records, collections=news, fresh=True)

        async def progress(done: int, total: int) -> None:
            await report({"typesense": {"phase": "copying", "done": done, "total": total}})

        snapshot_at = await copy_snapshot(self._store.pool, write, progress)
        since = snapshot_at - REPLAY_MARGIN
        await report({"typesense": {"phase": "replaying", "since": since.isoformat()}})
        await self._replay(since, news)
        old = await groups.switch(news)
        await self._replay(since, news)
        await groups.drop({alias: name for alias, name in old.items() if name != news[alias]})
        strays = await groups.drop_strays()
        if strays:
            log.info("dropped the collections of another typesense.groups: %s", ", ".join(strays))
        await report({"typesense": {"phase": "switched", "previous": old, "dropped": strays}})

    async def _replay(self, since: Any, collections: dict[str, str], tenant: str | None = None) -> None:
        """Re-apply every memory (of ``tenant``, if given) the outbox saw
        since ``since`` to those of its aliases ``collections`` names, into
        the collections it names."""
        await replay(self._store.pool, self._sync, self._index, since, collections, tenant)


async def _merged(
    report: Callable[[dict[str, Any]], Awaitable[None]],
    target: str,
    key: str,
    state: dict[str, Any],
    update: dict[str, Any],
) -> None:
    """Merge ``update`` into ``state`` and report it whole as ``{target: {key: state}}``."""
    state.update(update)
    await report({target: {key: state}})


def _job_collections(progress: dict[str, Any], alias: str) -> tuple[dict[str, str], dict[str, str | None]]:
    """A Typesense job's new collections and the ones before, by group alias
    (a job of a Braid before groups names one of each, of ``alias``)."""
    if "collections" in progress:
        return dict(progress["collections"]), dict(progress.get("previous") or {})
    return {alias: progress["collection"]}, {alias: progress.get("previous")}
