"""The engine behind the HTTP API: writes, the fused recall, health, reload.

It owns nothing it did not get: pools, clients and the embedder are opened
by :mod:`indexers.runtime` and handed in, so tests can build one from parts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from datetime import time as day_start
from typing import TYPE_CHECKING, Protocol, TypeVar

import anyio
import msgspec
import numpy as np
import psycopg
from psycopg_pool import PoolTimeout

from config import FIXED_SECTIONS, RESTART_SECTIONS, BraidConfig, ConfigError, ConfigHolder, load_config
from fusion import Assembly, FactorWeights, QueryPlan, analyze_query, get_encoding, rank

from .base import (
    SHOWN_FIELDS,
    BackendError,
    EmbeddingRefused,
    EmbeddingUnavailable,
    Filters,
    Hit,
    MemoryRecord,
    SearchesFirst,
    SearchQuery,
    Source,
    StoreUnavailable,
    WriteTimeout,
    failure_reason,
    postgres_errors,
)
from .bookkeeping import Bookkeeper
from .cache import RecallCache, cache_key
from .embedding import Embedder, NameVectors
from .extraction import Extraction, ExtractionStats, Extractors
from .lifecycle import Forgetting
from .postgres import (
    Deleted,
    EntityInput,
    MemoryInput,
    PostgresStore,
    RelationInput,
    ReplicaRouter,
    Written,
    entity_text,
    normalize_name,
    primary_lsn,
    read_generation,
)
from .registry import BOTH, DEGRADED, SourceResult, registered, search_all
from .results import (
    STRATEGY_MATCHES,
    EmbeddingStatus,
    QueryInfo,
    RecallItem,
    RecallOptions,
    RecallResult,
    ReloadReport,
    SourceReport,
    Strategy,
    changed_keys,
)

if TYPE_CHECKING:
    from .tracing import Tracing

__all__ = [
    "Engine",
    "EngineObserver",
    "GraphWrite",
    "MemoryWrite",
    "ReplicaReads",
    "UNINDEXED_LIMIT",
    "WRITE_TIMEOUT_S",
]

log = logging.getLogger("braid")

T = TypeVar("T")

#: Memories written but not yet in a derived source (Typesense) that a recall
#: hands it to rank as it would (:attr:`indexers.base.SearchQuery.unindexed`):
#: the newest ones. A longer backlog (Typesense down, a bulk import) is found
#: by the other sources until the outbox catches up.
UNINDEXED_LIMIT = 256

#: The fused list of the search within the dates a query names
#: (``query.dateSearchDays``, :meth:`Engine._dated_query`): the name its ranks show.
DATES = "dates"

#: Tenants whose speaker lists one process keeps (cleared whole when full).
_SPEAKER_CACHE_TENANTS = 10_000

#: The longest one write step waits on Postgres (for a connection, then for its
#: transaction) before the write is refused with a 503. The pool's own wait for a
#: connection (5 s) bounds only the first part: without this, a write hangs for as
#: long as a Postgres that accepts connections but never answers does.
WRITE_TIMEOUT_S = 10.0


#: A memory as the API accepts it, validated; the engine fills in the embedding.
MemoryWrite = MemoryInput


class GraphWrite(msgspec.Struct, frozen=True):
    entities: tuple[EntityInput, ...]
    relations: tuple[RelationInput, ...]


class EngineObserver(Protocol):
    """Told of every recall answered and every write stored (``service.metrics``
    counts them). Called on the request path: it must be quick and never raise."""

    def recalled(self, result: RecallResult) -> None: ...

    def wrote(self, written: Written) -> None: ...


@dataclass(frozen=True)
class ReplicaReads:
    """What a recall reads on the streaming replica (``postgres.replicaDsn``):
    a store and the Postgres sources on the replica's pool (the other sources
    are the primary's), and the router that says when it may."""

    router: ReplicaRouter
    store: PostgresStore
    sources: Mapping[str, Source]


class _Side:
    """The Postgres one recall reads, the primary or the replica; a read that
    fails on the replica is noted (``failed``) and the recall is answered
    again from the primary."""

    __slots__ = ("failed", "replica", "sources", "store")

    def __init__(self, store: PostgresStore, sources: Mapping[str, Source], *, replica: bool) -> None:
        self.store = store
        self.sources = sources
        self.replica = replica
        self.failed: str | None = None

    def fail(self, what: str, exc: BaseException, seconds: float | None = None) -> None:
        """Note ``what`` failed on the replica (``seconds``: the step's deadline, :func:`failure_reason`)."""
        if self.replica and self.failed is None:
            self.failed = f"{what}: {failure_reason(exc, seconds)}"


class _Unindexed:
    """The memories not yet in the derived sources' copies, read once per
    recall while the sources search; none until the read is done."""

    def __init__(self) -> None:
        self.records: tuple[MemoryRecord, ...] = ()
        self._done = anyio.Event()

    async def read(self, records: Awaitable[tuple[MemoryRecord, ...]]) -> None:
        try:
            self.records = await records
        finally:
            self._done.set()

    @property
    def done(self) -> bool:
        """Whether the read is over (read, failed or cancelled)."""
        return self._done.is_set()

    async def wait(self, timeout_s: float) -> tuple[MemoryRecord, ...]:
        """The memories read, waiting at most ``timeout_s`` for the read
        (none if it is not done by then)."""
        if not self.done:
            with anyio.move_on_after(timeout_s):
                await self._done.wait()
        return self.records


class _AfterUnindexed:
    """A derived source searching with the recall's unindexed memories
    (:attr:`SearchQuery.unindexed`), waiting for them at most ``wait_s``
    from its start: past that it ranks without them, as before its copy
    catches up. A source that can (:class:`SearchesFirst`) sends its
    searches first and waits for them only to rank."""

    def __init__(self, source: Source, unindexed: _Unindexed, wait_s: float) -> None:
        self.source = source
        self.name = source.name
        self.needs_vector = source.needs_vector
        self.unindexed = unindexed
        self.wait_s = wait_s

    async def search(self, query: SearchQuery) -> list[Hit]:
        if isinstance(self.source, SearchesFirst):
            until = time.monotonic() + self.wait_s

            async def unindexed() -> tuple[MemoryRecord, ...]:
                return await self.unindexed.wait(max(0.0, until - time.monotonic()))

            return await self.source.search_first(query, unindexed)
        records = await self.unindexed.wait(self.wait_s)
        return await self.source.search(msgspec.structs.replace(query, unindexed=records))

    async def aclose(self) -> None:
        """Nothing to release: the source is closed by the engine."""


class Engine:
    def __init__(
        self,
        config: ConfigHolder,
        store: PostgresStore,
        sources: Mapping[str, Source],
        embedder: Embedder,
        bookkeeper: Bookkeeper | None = None,
        extractors: Extractors | None = None,
        replica: ReplicaReads | None = None,
    ) -> None:
        self.config = config
        #: What extracts entities and relations on write (``graph.extract``).
        self.extractors = Extractors() if extractors is None else extractors
        #: This process's extraction counts (``/health``).
        self.extraction = ExtractionStats(extractor=config.current.graph.extract)
        #: Records what recalls return; None: no usage is read or recorded.
        self.bookkeeper = bookkeeper
        self.store = store
        self.sources = dict(sources)
        #: Recalls read here when the tenant's writes are replayed (None: no replica).
        self.replica = replica
        #: The sources that read Postgres (a replica's failure shows in their status).
        self._on_postgres = {n for n, spec in registered().items() if spec.store == "postgres" and n in self.sources}
        #: The sources whose lists cover the vector's neighbours (SourceSpec.covers_vectors).
        self._covering = {n for n, spec in registered().items() if spec.covers_vectors and n in self.sources}
        #: What each source matches by (SourceSpec.matches); an unregistered one, both.
        specs = registered()
        self._matches = {n: specs[n].matches if n in specs else BOTH for n in self.sources}
        #: The sources searching a copy that may lag Postgres (SourceSpec.derived).
        self._derived = {n for n in self.sources if n in specs and specs[n].derived}
        self.embedder = embedder
        #: Entity texts' vectors, shared by the tenants (``NameVectors``).
        self.names = NameVectors()
        # tenant -> (monotonic expiry, speaker names)
        self._speakers: dict[str, tuple[float, list[str]]] = {}
        self.write_timeout_s = WRITE_TIMEOUT_S
        #: Answers of identical recalls (``cache.ttlMs``), checked against write generations.
        self.cache = RecallCache()
        #: Told of recalls and writes (metrics); None: nobody is.
        self.observer: EngineObserver | None = None
        #: Spans of recalls (``traces.enabled``); None: none are made.
        self.tracing: Tracing | None = None

    # --- config -------------------------------------------------------------

    async def reload_config(self) -> ReloadReport:
        """Re-read the config file and put it in force; on any error keep the
        running one and raise :class:`ConfigError` saying why.

        Refused: a change to a section the running pools were built from
        (:data:`config.FIXED_SECTIONS`), and the removal of a memory tier
        that still holds memories (its memories would be unreachable).
        Accepted but named in the report: keys read only at start-up
        (:data:`config.RESTART_SECTIONS`), and tier index settings that take
        effect through a reindex.
        """
        new = load_config(self.config.path)
        old = self.config.current
        # The query-embedding deadline is read at every recall: it may change.
        fixed_new = msgspec.structs.replace(
            new, embedding=msgspec.structs.replace(new.embedding, query_deadline_ms=old.embedding.query_deadline_ms)
        )
        for section in FIXED_SECTIONS:
            if getattr(fixed_new, section) != getattr(old, section):
                raise ConfigError(f"`{section}` cannot change without a restart; config not reloaded")
        dropped = [t for t in old.memory_tiers if t not in new.memory_tiers]
        if dropped:
            try:
                with anyio.fail_after(WRITE_TIMEOUT_S):
                    in_use = await self.store.tiers_in_use(dropped)
            except (TimeoutError, PoolTimeout, psycopg.Error) as exc:
                raise ConfigError(
                    f"the new config removes tier(s) {dropped} and Postgres could not be asked "
                    f"whether they hold memories ({type(exc).__name__}); config not reloaded"
                ) from None
            if in_use:
                raise ConfigError(
                    f"the new config removes tier(s) {in_use} that hold memories; keep them "
                    "(a tier may be renamed only once it is empty); config not reloaded"
                )
        restart = [
            f"{section}.{key}"
            for section in RESTART_SECTIONS
            for key in changed_keys(getattr(old, section), getattr(new, section))
        ]
        reindex = [
            f"tiers.{name}.{key}"
            for name, tier in new.tiers.items()
            if name in old.tiers
            for key in changed_keys(old.tiers[name], tier)
            # The fold's keys too: a tier ranks as Postgres records until its reindex.
            if key in ("m", "efConstruction", "objective", "halfLifeDays")
        ]
        # Keys read at start-up stay as they were until a restart.
        for section in RESTART_SECTIONS:
            new = msgspec.structs.replace(new, **{section: getattr(old, section)})
        self.config.current = new
        # Answers computed under the old config (weights, retention) are not this one's.
        self.cache.clear()
        log.info("config reloaded from %s", self.config.path)
        if restart:
            log.warning("config keys that take effect only after a restart: %s", ", ".join(restart))
        return ReloadReport(restart_required=restart, reindex_required=reindex)

    # --- writes -------------------------------------------------------------

    async def _bounded(self, step: Awaitable[T]) -> T:
        """Await one Postgres step of a write for at most :attr:`write_timeout_s`,
        its errors translated (:func:`indexers.base.postgres_errors`)."""
        try:
            with postgres_errors("write"), anyio.fail_after(self.write_timeout_s):
                return await step
        except TimeoutError as exc:
            raise WriteTimeout(self.write_timeout_s) from exc

    async def write_memories(self, tenant: str, memories: Sequence[MemoryWrite]) -> Written:
        """Store ``memories``: each embedded (unless it brings its vector),
        linked to the entities it names and those extracted from its content
        (``graph.extract``), in one transaction (:meth:`PostgresStore.write_memories`).

        The entities a client names and the extracted ones are merged by
        normalised name (the client's spelling kept); a new entity takes the
        extractor's type. An extraction that fails does not fail the write:
        the memories are stored with the client's entities only, the failure
        is logged and counted (``/health``: ``extraction.failed``), and
        ``POST /admin/reindex {"target": "graph"}`` extracts them again."""
        model = self.embedder.model
        missing = [m.content for m in memories if m.embedding is None]
        # Extraction and embedding run at once, each on its own thread; an
        # embedding error is raised as it is (not in a task group's exception group).
        embedded: list[list[tuple[float, ...]]] = []
        failed: list[Exception] = []

        async def embed() -> None:
            try:
                embedded.append(await self.embedder.embed(missing))
            except Exception as exc:
                failed.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(embed)
            extracted = await self._extract(tenant, memories)
        if failed:
            raise failed[0]
        vectors = iter(embedded[0])
        inputs = [
            msgspec.structs.replace(m, embedding=next(vectors), model=model)
            if m.embedding is None
            else msgspec.structs.replace(m, model=m.model or model)
            for m in memories
        ]
        named: dict[str, str] = {}
        types: dict[str, str] = {}
        for m in memories:
            for n in m.entities:
                named.setdefault(normalize_name(n), " ".join(n.split()))
        for x in extracted or ():
            for e in x.entities:
                named.setdefault(normalize_name(e.name), e.name)
                types.setdefault(normalize_name(e.name), e.type)
        new_entities = await self._new_entities(tenant, named, types)
        cfg = self.config.current
        # A small tenant's rows stay out of the tiers' shared HNSW indexes (indexers.postgres.unshared).
        exact_below = {tier: cfg.tiers[tier].exact_below for tier in cfg.memory_tiers}
        written = await self._bounded(
            self.store.write_memories(
                tenant,
                inputs,
                new_entities,
                extracted,
                exact_below=exact_below,
                entity_exact_below=cfg.tiers[cfg.entity_tier].exact_below,
            )
        )
        await self._wrote(tenant)
        cached = self._speakers.get(tenant)
        if cached is not None and not {m.speaker for m in memories if m.speaker} <= set(cached[1]):
            # A new speaker: the next recall or write reads the list again.
            self._speakers.pop(tenant, None)
        if self.observer is not None:
            self.observer.wrote(written)
        return written

    async def _new_entities(self, tenant: str, named: Mapping[str, str], types: Mapping[str, str]) -> list[EntityInput]:
        """The entities of ``named`` (normalised name -> spelling) that the
        tenant does not have yet, embedded, typed from ``types``."""
        ordered = sorted(named.values(), key=normalize_name)
        existing = await self._bounded(self.store.existing_entities(tenant, ordered))
        new_names = [n for n in ordered if normalize_name(n) not in existing]
        vectors = await self.names.embed(self.embedder, new_names)
        return [
            EntityInput(name=n, embedding=v, model=self.embedder.model, type=types.get(normalize_name(n)))
            for n, v in zip(new_names, vectors, strict=True)
        ]

    async def _extract(self, tenant: str, memories: Sequence[MemoryWrite]) -> list[Extraction] | None:
        """What ``graph.extract`` finds in each memory's content (not its
        context), aligned with ``memories``; None when it is ``none`` or fails.

        The tenant's speakers (and the batch's) are not extracted: who said a
        memory is its ``speaker``, and a speaker's name in a turn mostly
        addresses them ("Thanks, Caroline!") rather than says what it is about.
        """
        graph = self.config.current.graph
        self.extraction.extractor = graph.extract
        if graph.extract == "none" or not memories:
            return None
        speakers = [*await self.tenant_speakers(tenant), *(m.speaker for m in memories if m.speaker)]
        skip = frozenset(normalize_name(s) for s in speakers)
        try:
            extractor = self.extractors.get(graph.extract)
            if extractor is None:
                return None
            out = await extractor.extract(
                [m.content for m in memories], skip=skip, max_entities=graph.extract_max_entities
            )
        except Exception as exc:  # the write lands without extraction: counted, logged, re-extractable
            self.extraction.failed += len(memories)
            log.warning(
                "entity extraction (%s) failed, %d memories stored with the client's entities only: %s",
                graph.extract,
                len(memories),
                str(exc) or type(exc).__name__,
            )
            return None
        self.extraction.memories += len(out)
        self.extraction.entities += sum(len(x.entities) for x in out)
        self.extraction.relations += sum(len(x.relations) for x in out)
        return out

    async def write_graph(self, tenant: str, graph: GraphWrite) -> dict[str, int]:
        model = self.embedder.model
        given = {normalize_name(e.name) for e in graph.entities}
        texts = [entity_text(e.name, e.summary) for e in graph.entities]
        vectors = await self.names.embed(self.embedder, texts)
        entities = [
            msgspec.structs.replace(e, embedding=v, model=model) for e, v in zip(graph.entities, vectors, strict=True)
        ]
        referenced = sorted({" ".join(n.split()) for r in graph.relations for n in (r.source, r.target)})
        referenced = [n for n in referenced if normalize_name(n) not in given]
        existing = await self._bounded(self.store.existing_entities(tenant, referenced))
        implicit = [n for n in referenced if normalize_name(n) not in existing]
        for n, v in zip(implicit, await self.names.embed(self.embedder, implicit), strict=True):
            entities.append(EntityInput(name=n, embedding=v, model=model))
        cfg = self.config.current
        counts = await self._bounded(
            self.store.write_graph(
                tenant, entities, graph.relations, entity_exact_below=cfg.tiers[cfg.entity_tier].exact_below
            )
        )
        await self._wrote(tenant)
        return counts

    async def delete_memory(self, tenant: str, memory_id: str, *, restore_previous: bool = False) -> Deleted | None:
        deleted = await self._bounded(self.store.delete_memory(tenant, memory_id, restore_previous=restore_previous))
        await self._wrote(tenant)
        return deleted

    async def _wrote(self, tenant: str) -> None:
        """After a write of ``tenant`` committed: the primary's WAL position,
        which the tenant's recalls wait for on the replica (read-your-writes,
        :mod:`indexers.postgres.replica`). Never fails the write, which is
        stored: when the position cannot be read the tenant's recalls read the
        primary until one is."""
        if self.replica is None:
            return
        try:
            lsn = await self._bounded(primary_lsn(self.store.pool))
        except BackendError as exc:
            log.warning("WAL position after a write unavailable, the tenant's recalls read the primary: %s", exc)
            self.replica.router.wrote_unknown(tenant)
            return
        self.replica.router.wrote(tenant, lsn)

    def last_write(self, tenant: str) -> int | None:
        """The WAL position a recall of ``tenant`` needs to see its writes made
        here (``Braid-Lsn``); None without a replica."""
        return None if self.replica is None else self.replica.router.last_write(tenant)

    async def memory(self, tenant: str, memory_id: str) -> MemoryRecord | None:
        """One memory of the tenant with its lifecycle, read under the write bound."""
        return await self._read(self.store.memory(tenant, memory_id))

    async def versions(self, tenant: str, mem_key: str, limit: int) -> list[MemoryRecord]:
        """The tenant's versions of ``mem_key``, newest first."""
        return await self._read(self.store.versions(tenant, mem_key, limit))

    async def _read(self, step: Awaitable[T]) -> T:
        """A Postgres read an endpoint answers with: bounded like a write step,
        a stall or an outage a 503."""
        try:
            with postgres_errors("read"), anyio.fail_after(self.write_timeout_s):
                return await step
        except TimeoutError as exc:
            raise StoreUnavailable("read", f"no answer within {self.write_timeout_s:g} s") from exc

    async def delete_relations(self, tenant: str, source: str, target: str, relation: str | None) -> int:
        removed = await self._bounded(self.store.delete_relations(tenant, source, target, relation))
        await self._wrote(tenant)
        return removed

    async def delete_entity(self, tenant: str, name: str) -> int | None:
        removed = await self._bounded(self.store.delete_entity(tenant, name))
        await self._wrote(tenant)
        return removed

    # --- recall -------------------------------------------------------------

    async def tenant_speakers(self, tenant: str, side: _Side | None = None) -> list[str]:
        """The tenant's speaker names, cached for ``query.speakerCacheMs``.

        Postgres slow or down must not stop a recall that Typesense can still
        answer: the lookup waits at most ``query.speakerLookupMs``, and on
        failure the last list read (or none) is used, and kept like a list read,
        so that while Postgres is down only one recall per ``speakerCacheMs``
        waits for it.
        """
        cfg = self.config.current
        now = time.monotonic()
        cached = self._speakers.get(tenant)
        if cached is not None and cached[0] > now:
            return cached[1]
        store = self.store if side is None else side.store
        deadline = cfg.query.speaker_lookup_ms / 1000.0
        try:
            with anyio.fail_after(deadline):
                names = await store.speakers(tenant)
        except (TimeoutError, PoolTimeout, psycopg.Error) as exc:
            if side is not None and side.replica:
                # The primary's list is read when the recall is answered again there.
                side.fail("speaker list", exc, deadline)
                return [] if cached is None else cached[1]
            log.warning(
                "speaker list unavailable, query analysis uses the last one read: %s", failure_reason(exc, deadline)
            )
            names = [] if cached is None else cached[1]
        ttl = cfg.query.speaker_cache_ms / 1000.0
        if ttl > 0:
            if len(self._speakers) >= _SPEAKER_CACHE_TENANTS:
                self._speakers.clear()
            self._speakers[tenant] = (now + ttl, names)
        return names

    async def plan(self, tenant: str, query: str, side: _Side | None = None, now: datetime | None = None) -> QueryPlan:
        """The query's :class:`QueryPlan`; dates named relative to ``now``
        (``query.relativeDates``) are read against its UTC day."""
        q = self.config.current.query
        wants_speakers = q.strip_speakers or q.speaker_boost > 0 or q.self_boost > 0
        speakers = await self.tenant_speakers(tenant, side) if wants_speakers else []
        today = None
        if q.relative_dates and now is not None:
            today = (now if now.tzinfo is None else now.astimezone(UTC)).date()
        return analyze_query(
            query,
            speakers,
            strip_speakers=q.strip_speakers,
            strip_dates=q.strip_dates,
            today=today,
            self_names=q.self_speakers if q.self_boost > 0 else (),
        )

    async def recall(self, tenant: str, opts: RecallOptions, *, at_least: int = 0) -> RecallResult:
        """The recall's answer (:meth:`_routed`), in a span when tracing is on,
        told to the observer when there is one. ``at_least``: a WAL position
        the answer must have seen (``Braid-Lsn``, a write's through another process)."""
        if self.tracing is None:
            result = await self._routed(tenant, opts, at_least)
        else:
            with self.tracing.recall() as span:
                result = await self._routed(tenant, opts, at_least)
                self.tracing.recalled(span, result)
        if self.observer is not None:
            self.observer.recalled(result)
        return result

    def _primary(self) -> _Side:
        return _Side(self.store, self.sources, replica=False)

    async def _routed(self, tenant: str, opts: RecallOptions, at_least: int) -> RecallResult:
        """The recall's answer (:meth:`_recall`) from the replica when the
        router allows (it has replayed the tenant's writes and ``at_least``),
        else from the primary; from the primary too when a read on the
        replica fails (the replica is then left alone until it answers again)."""
        if self.replica is None:
            return await self._recall(tenant, opts, self._primary())
        router = self.replica.router
        if await router.use_replica(tenant, at_least):
            side = _Side(self.replica.store, self.replica.sources, replica=True)
            try:
                result = await self._recall(tenant, opts, side)
            except BackendError as exc:
                side.fail("read", exc)
            else:
                if side.failed is None:
                    router.served(replica=True)
                    return msgspec.structs.replace(result, served_by="replica")
            assert side.failed is not None
            router.failed(side.failed)
        result = await self._recall(tenant, opts, self._primary())
        router.served(replica=False)
        return result

    async def _recall(self, tenant: str, opts: RecallOptions, side: _Side) -> RecallResult:
        """The recall's answer, from the result cache when ``cache.ttlMs`` allows
        (:mod:`indexers.cache`; such an answer says ``cached: true``).

        The tenant's write generation is read first, bounded by
        ``query.speakerLookupMs``; when it cannot be read the recall is computed
        and not stored. Answers with a degraded part are not stored either (a
        source's outage must not outlive it), nor those computed while a change
        of the tenant was still on its way to Typesense. A hit still records the use of
        its memories when the recall asks to (``track``).
        """
        cfg = self.config.current
        if cfg.cache.ttl_ms <= 0:
            return await self._compute(tenant, opts, side)
        key = cache_key(tenant, opts)
        generation, synced = await self._generation(tenant, side)
        if generation is not None:
            hit = self.cache.get(key, generation)
            if hit is not None:
                if opts.track and self.bookkeeper is not None:
                    self.bookkeeper.record(tenant, [item.id for item in hit.items])
                return msgspec.structs.replace(hit, cached=True)
        result = await self._compute(tenant, opts, side)
        # Stored only when Typesense had every acknowledged change before the
        # recall began: its lag must not be kept for ttlMs.
        if generation is not None and synced and not result.degraded and side.failed is None:
            forgetting = Forgetting.from_config(cfg)
            dies_at = min((forgetting.dies_at_of(item) for item in result.items), default=float("inf"))
            self.cache.put(
                key,
                generation,
                result,
                ttl_ms=cfg.cache.ttl_ms,
                dies_at=dies_at,
                max_entries=cfg.cache.max_entries,
            )
        return result

    async def _generation(self, tenant: str, side: _Side) -> tuple[int | None, bool]:
        """The tenant's write generation and whether its outbox is drained
        (:func:`indexers.postgres.read_generation`); None when Postgres does not
        answer within ``query.speakerLookupMs``."""
        deadline = self.config.current.query.speaker_lookup_ms / 1000.0
        try:
            with anyio.fail_after(deadline):
                return await read_generation(side.store.pool, tenant)
        except (TimeoutError, PoolTimeout, psycopg.Error) as exc:
            side.fail("write generation", exc, deadline)
            log.warning("write generation unavailable, this recall skips the cache: %s", failure_reason(exc, deadline))
            return None, False

    async def _compute(self, tenant: str, opts: RecallOptions, side: _Side) -> RecallResult:
        """Run the recall's strategy (:data:`indexers.results.Strategy`): ``auto``
        with an empty query runs as ``recent``, and as ``keyword`` once the
        query embedding misses its deadline."""
        if opts.strategy == "recent" or (opts.strategy == "auto" and not opts.query.strip()):
            return await self._recent(tenant, opts, side)
        cfg = self.config.current
        top_k = opts.top_k or cfg.search_top_k
        budget = opts.budget_tokens or cfg.context_budget_tokens
        min_conf = cfg.min_confidence if opts.min_confidence is None else opts.min_confidence
        now = opts.reference_time or opts.filters.as_of or datetime.now(UTC)
        plan = await self.plan(tenant, opts.query, side, now)
        allowed = STRATEGY_MATCHES[opts.strategy]

        wanted = [
            name
            for name in self.sources
            if cfg.source(name).enabled
            and (opts.sources is None or name in opts.sources)
            and self._matches[name] & allowed
        ]
        embedding_ms = 0.0
        vector = opts.embedding if "vector" in allowed else None
        embedding_status: EmbeddingStatus = "client" if "vector" in allowed else "none"
        covering = self._covering.intersection(wanted)
        derived = self._derived.intersection(wanted)
        unindexed = _Unindexed()
        async with anyio.create_task_group() as reads:
            if derived:
                # Read while the query is embedded and the other sources search:
                # a derived source waits for it at most half its own deadline
                # (_AfterUnindexed), so a slow Postgres costs no wait of its own.
                # Their embeddings only for a source that searches by vector itself.
                embeddings = "vector" in allowed and any(not covering - {n} for n in derived)
                reads.start_soon(unindexed.read, self._unindexed(tenant, opts, min_conf, embeddings, side))
            if vector is None and "vector" in allowed:
                # The query lane never waits for writes, but it can be busy with other
                # recalls' queries or short of CPU: past the deadline the recall goes
                # on without a vector (the inference still finishes and is cached).
                # A hosted embedder that fails (indexers.hosted_embedding) degrades the
                # recall the same way, as `error`.
                start = time.perf_counter()
                failed = False
                with anyio.move_on_after(cfg.embedding.query_deadline_ms / 1000.0):
                    try:
                        vector = await self.embedder.embed_query(plan.text)
                    except (EmbeddingUnavailable, EmbeddingRefused):
                        failed = True
                embedding_ms = round((time.perf_counter() - start) * 1000.0, 3)
                embedding_status = "ok" if vector is not None else "error" if failed else "timeout"

            queries = {
                name: SearchQuery(
                    tenant=tenant,
                    text=plan.text,
                    vector=vector,
                    limit=max(top_k, cfg.source(name).candidates),
                    filters=opts.filters,
                    min_confidence=min_conf,
                    hops=opts.hops,
                    vectors_covered=bool(covering - {name}),
                    reference_time=now,
                    matches=self._matches[name] & allowed,
                    model=(opts.embedding_model if opts.embedding is not None else None) or self.embedder.model,
                )
                for name in wanted
            }
            if self.tracing is not None and embedding_status not in ("client", "none"):
                self.tracing.embedded(embedding_ms, embedding_status)
            sources: dict[str, Source] = {
                name: _AfterUnindexed(source, unindexed, cfg.source(name).deadline_ms / 2000.0)
                if name in derived
                else source
                for name, source in side.sources.items()
            }
            dated = self._dated_query(plan, cfg, queries, opts.filters)
            dated_hits: list[Hit] = []
            if dated is None:
                searched = await search_all(sources, queries, cfg, self.tracing)
            else:
                searched, dated_hits = await self._search_with_dates(sources, queries, cfg, dated)
            if not unindexed.done:
                # A read still waiting is of no use now.
                reads.cancel_scope.cancel()
        if side.replica:
            failing = sorted(
                n for n in self._on_postgres if n in searched and searched[n].status in ("error", "timeout")
            )
            if failing:
                side.failed = side.failed or f"{', '.join(failing)}: {searched[failing[0]].status}"
        results = await self._current_only(tenant, searched, opts.filters.as_of, side)
        lists = {name: r.hits for name, r in results.items()}
        weights = {name: cfg.source(name).weight for name in results}
        if dated is not None and dated_hits:
            # Ranked like any source's list; its hits are read from Postgres as they are now.
            lists[DATES] = dated_hits
            weights[DATES] = cfg.source(dated[0]).weight
        ranking = rank(
            lists,
            plan,
            k=cfg.rrf.k,
            weights=weights,
            factors=factor_weights(cfg),
            reference_time=now,
            min_confidence=min_conf,
        )
        usage = await self._usage(tenant, ranking.usage_ids(top_k), side)
        vectors = await self._vectors(tenant, ranking.restatement_ids(usage), side)
        answer = ranking.finish(
            usage=usage, top_k=top_k, budget=budget, encoding=get_encoding(cfg.tokenizer), vectors=vectors
        )
        # An answer the replica failed is answered again from the primary, which records its use.
        if opts.track and self.bookkeeper is not None and side.failed is None:
            self.bookkeeper.record(tenant, [r.hit.id for r in answer.items])
        # Without its vector an auto recall searched by keyword alone.
        ran: Strategy = "keyword" if opts.strategy == "auto" and vector is None else opts.strategy
        return _result(
            answer, results, plan, embedding_ms=embedding_ms, embedding_status=embedding_status, strategy=ran
        )

    def _dated_query(
        self, plan: QueryPlan, cfg: BraidConfig, queries: Mapping[str, SearchQuery], filters: Filters
    ) -> tuple[str, SearchQuery] | None:
        """The search within the dates the query names (``query.dateSearchDays``):
        the query of this recall's vector source on Postgres, with a vector,
        restricted to the memories created on those days (UTC, from the first
        day's start to the last day's end, inside the request's own
        ``created_after``/``created_before``) and without floors, and that
        source's name. ``None`` when the query names no date or dates spanning
        more than ``dateSearchDays`` days, no such source searches, or the days
        and the request's filters do not overlap."""
        if not plan.dates or DATES in queries:
            return None
        first_day = min(a for a, _ in plan.dates)
        last_day = max(b for _, b in plan.dates)
        if (last_day - first_day).days + 1 > cfg.query.date_search_days:
            return None
        name = next(
            (n for n in queries if n in self._covering and n in self._on_postgres and queries[n].vector is not None),
            None,
        )
        if name is None:
            return None
        first = datetime.combine(first_day, day_start.min, UTC)
        last = datetime.combine(last_day + timedelta(days=1), day_start.min, UTC) - timedelta(microseconds=1)
        if filters.created_after is not None:
            first = max(first, filters.created_after)
        if filters.created_before is not None:
            last = min(last, filters.created_before)
        if first > last:
            return None
        query = queries[name]
        within = msgspec.structs.replace(query.filters, created_after=first, created_before=last)
        return name, msgspec.structs.replace(query, filters=within, floors=False)

    async def _search_with_dates(
        self,
        sources: Mapping[str, Source],
        queries: Mapping[str, SearchQuery],
        cfg: BraidConfig,
        dated: tuple[str, SearchQuery],
    ) -> tuple[dict[str, SourceResult], list[Hit]]:
        """:func:`search_all` and, beside it, ``dated``'s search (its source's
        own deadline). A failed or late dated search is logged and leaves an
        empty list: the sources' answers stand without it."""
        name, query = dated
        deadline = cfg.source(name).deadline_ms / 1000.0
        searched: dict[str, SourceResult] = {}
        hits: list[Hit] = []

        async def every_source() -> None:
            searched.update(await search_all(sources, queries, cfg, self.tracing))

        async def within_dates() -> None:
            with anyio.move_on_after(deadline) as scope:
                try:
                    hits.extend(await sources[name].search(query))
                except Exception as exc:  # the sources' own answers must not fail with it
                    log.warning(
                        "the search within the query's dates failed, this recall ranks without it: %s",
                        failure_reason(exc, deadline),
                    )
            if scope.cancelled_caught:
                log.warning(
                    "the search within the query's dates had no answer within %.0f ms, this recall ranks without it",
                    deadline * 1000,
                )

        async with anyio.create_task_group() as tg:
            tg.start_soon(every_source)
            tg.start_soon(within_dates)
        return searched, hits

    async def _recent(self, tenant: str, opts: RecallOptions, side: _Side) -> RecallResult:
        """The ``recent`` strategy: the newest memories passing the filters, from
        Postgres in one statement, newest first, formatted and budgeted as any
        recall's (one list named ``recent``, no factors). Postgres is the only
        store asked: no answer within the longest source deadline is a 503."""
        cfg = self.config.current
        top_k = opts.top_k or cfg.search_top_k
        min_conf = cfg.min_confidence if opts.min_confidence is None else opts.min_confidence
        deadline = max(cfg.source(name).deadline_ms for name in self.sources) / 1000.0 if self.sources else 1.0
        try:
            with postgres_errors("read"), anyio.fail_after(deadline):
                hits = await side.store.recent(
                    tenant,
                    opts.filters,
                    min_confidence=min_conf,
                    memory_tiers=cfg.memory_tiers,
                    limit=top_k,
                    forgetting=Forgetting.from_config(cfg),
                )
        except TimeoutError as exc:
            raise StoreUnavailable("read", f"no answer within {deadline * 1000:.0f} ms") from exc
        plan = QueryPlan(text="")
        answer = rank(
            {"recent": hits},
            plan,
            k=cfg.rrf.k,
            weights={"recent": 1.0},
            factors=FactorWeights(),
            reference_time=opts.reference_time or opts.filters.as_of or datetime.now(UTC),
            min_confidence=min_conf,
        ).finish(
            usage={},
            top_k=top_k,
            budget=opts.budget_tokens or cfg.context_budget_tokens,
            encoding=get_encoding(cfg.tokenizer),
        )
        if opts.track and self.bookkeeper is not None:
            self.bookkeeper.record(tenant, [r.hit.id for r in answer.items])
        skipped = {name: SourceResult(status="skipped", ms=0.0) for name in self.sources}
        return _result(answer, skipped, plan, embedding_ms=0.0, embedding_status="none", strategy="recent")

    async def _current_only(
        self, tenant: str, results: dict[str, SourceResult], as_of: datetime | None, side: _Side
    ) -> dict[str, SourceResult]:
        """The lists with the hits of derived sources (``SourceSpec.derived``:
        Typesense, which the outbox may not have told yet) that Postgres does
        not hold as current (at ``as_of``) taken out, before fusion, so they
        neither rank nor take a place. One round trip for every such hit,
        under ``query.speakerLookupMs``. When Postgres cannot answer, only the
        hits with a ``mem_key`` are taken out: a memory without one is never
        superseded, and only a supersession makes a current memory stale."""
        derived = {n for n in results if n in self._derived and results[n].hits}
        ids = {h.id for n in derived for h in results[n].hits}
        if not ids:
            return results
        live: set[str] | None = None
        deadline = self.config.current.query.speaker_lookup_ms / 1000.0
        try:
            with anyio.fail_after(deadline):
                live = await side.store.live(tenant, sorted(ids), as_of)
        except (TimeoutError, PoolTimeout, psycopg.Error) as exc:
            side.fail("lifecycle check", exc, deadline)
            log.warning(
                "lifecycle check unavailable, hits with a mem_key are left out: %s", failure_reason(exc, deadline)
            )

        def keep(h: Hit) -> bool:
            if live is not None:
                return h.id in live
            return h.mem_key is None and (as_of is None or h.created_at <= as_of)

        return {
            n: msgspec.structs.replace(r, hits=[h for h in r.hits if keep(h)]) if n in derived else r
            for n, r in results.items()
        }

    async def _unindexed(
        self, tenant: str, opts: RecallOptions, min_confidence: float, embeddings: bool, side: _Side
    ) -> tuple[MemoryRecord, ...]:
        """The memories matching the recall's filters that are written but not
        yet in the derived sources' copies (:meth:`PostgresStore.unindexed`, the
        newest :data:`UNINDEXED_LIMIT`, with their embeddings if
        ``embeddings``); none when Postgres does not answer within
        ``query.speakerLookupMs`` (those sources then rank without them, as
        before they catch up)."""
        cfg = self.config.current
        read = side.store.unindexed(
            tenant,
            opts.filters,
            min_confidence=min_confidence,
            memory_tiers=cfg.memory_tiers,
            limit=UNINDEXED_LIMIT,
            forgetting=Forgetting.from_config(cfg),
            embeddings=embeddings,
        )
        return tuple(await self._ranking_read(read, "memories not yet indexed", [], side))

    async def _usage(self, tenant: str, ids: list[str], side: _Side) -> dict[str, int]:
        """The recall counts of ``ids``; none (the usage factor is left out)
        when Postgres is slow or down."""
        if not ids or self.bookkeeper is None:
            return {}
        counts = self.bookkeeper.counts(tenant, ids, pool=side.store.pool)
        return await self._ranking_read(counts, "usage counts", {}, side)

    async def _vectors(self, tenant: str, ids: list[str], side: _Side) -> dict[str, np.ndarray]:
        """The stored embeddings of ``ids``; none (the restatement factor is
        left out) when Postgres is slow or down."""
        if not ids:
            return {}
        return await self._ranking_read(side.store.embeddings(tenant, ids, self.embedder.model), "embeddings", {}, side)

    async def _ranking_read(self, step: Awaitable[T], what: str, missing: T, side: _Side) -> T:
        """``step``, a read a ranking factor needs, awaited for at most
        ``query.speakerLookupMs``; ``missing`` (the recall ranks without that
        factor, logged) when Postgres is slow or down."""
        deadline = self.config.current.query.speaker_lookup_ms / 1000.0
        try:
            with anyio.fail_after(deadline):
                return await step
        except (TimeoutError, PoolTimeout, psycopg.Error) as exc:
            side.fail(what, exc, deadline)
            if not side.replica:
                log.warning("%s unavailable, this recall ranks without them: %s", what, failure_reason(exc, deadline))
            return missing


def factor_weights(cfg: BraidConfig) -> FactorWeights:
    """The post-fusion factors as the config sets them."""
    q, r = cfg.query, cfg.ranking
    return FactorWeights(
        speaker_boost=q.speaker_boost,
        time_boost=q.time_boost,
        self_boost=q.self_boost,
        recency=r.recency_weight,
        recency_half_life_days=r.recency_half_life_days,
        importance=r.importance_weight,
        usage=r.usage_weight,
        usage_saturation=r.usage_saturation,
        order=r.order_weight,
        order_window=r.order_window,
        restatement_similarity=r.restatement_similarity,
        restatement_window=r.restatement_window,
        restatement_current_only=r.restatement_current_only,
        restatement_needs_change=r.restatement_needs_change,
    )


def _result(
    answer: Assembly[Hit],
    results: Mapping[str, SourceResult],
    plan: QueryPlan,
    *,
    embedding_ms: float,
    embedding_status: EmbeddingStatus,
    strategy: Strategy,
) -> RecallResult:
    items = [
        RecallItem(
            **{name: getattr(r.hit, name) for name in SHOWN_FIELDS},
            score=r.score,
            rrf_score=r.rrf_score,
            ranks=r.ranks,
            contributions=r.contributions,
            factors=r.factors,
            in_block=r.in_block,
            truncated=r.truncated,
        )
        for r in answer.items
    ]
    sources = {
        name: SourceReport(status=r.status, ms=r.ms, hits=len(r.hits), error=r.error) for name, r in results.items()
    }
    degraded = [n for n, r in results.items() if r.status in DEGRADED]
    if embedding_status in ("timeout", "error"):
        degraded.insert(0, "embedding")
    return RecallResult(
        block=answer.block,
        tokens=answer.tokens,
        items=items,
        sources=sources,
        degraded=degraded,
        embedding_ms=embedding_ms,
        embedding_status=embedding_status,
        query=QueryInfo(
            text=plan.text,
            speakers=list(plan.speakers),
            dates=list(plan.dates),
            current=plan.current,
            addressed=list(plan.addressed),
            others=list(plan.others),
            selves=list(plan.selves),
        ),
        strategy=strategy,
    )
