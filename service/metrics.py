"""Prometheus metrics of one service process, served at ``metrics.path``.

prometheus-client keeps the counts and writes the exposition (the text format,
or OpenMetrics when the scraper asks for it). Each app has a registry of its
own, so apps in one process (tests) do not add up. No label carries a tenant,
a key, a query or a memory: label values are route templates, methods,
statuses, source names, strategies and outcomes, a bounded set.

Recorded as requests are served (:class:`Metrics` is the engine's
:class:`indexers.engine.EngineObserver`, and wraps every route):

- ``braid_http_request_duration_seconds{route, method, status_class}``: each
  request that matched a route, from routing to the last byte of the answer.
- ``braid_http_errors_total{route, method, status}``: the answers >= 400.
- ``braid_recalls_total{strategy, cached}``: recalls answered, by the strategy that ran.
- ``braid_recall_degraded_total``: recalls that named something in ``degraded``.
- ``braid_source_duration_seconds{source}``: each source's search in a recall
  (``typesense``, ``pgvector``, ``graph``) and the query embedding
  (``embedding``), when it ran: a late one counts its deadline.
- ``braid_source_outcomes_total{source, outcome}``: one per computed recall and
  source, the source's status (``ok``, ``timeout``, ``error``, ``no_vector``,
  ``skipped``; for ``embedding`` the ``embedding_status``). A recall served from
  the result cache counts in ``braid_recalls_total`` only.
- ``braid_memories_written_total``, ``braid_memories_superseded_total``.

Read when scraped, from what the runtime already counts (nothing of this is
on the request path), plus two small Postgres queries bounded by 2 s:

- ``braid_outbox_pending``, ``braid_outbox_lag_seconds`` (age of the oldest
  pending row), ``braid_reindex_jobs_active``: Postgres, every process's;
  left out, and ``braid_postgres_up`` 0, when Postgres does not answer.
- ``braid_outbox_applied_total``, ``braid_outbox_sync_up``: this process's worker.
- ``braid_embedding_cache_{hits,misses}_total``: the query-embedding cache.
- ``braid_name_vectors_{hits,misses}_total``: entity names' vectors, cached
  across tenants (``indexers.embedding.NameVectors``).
- ``braid_recall_cache_{hits,misses}_total``, ``braid_recall_cache_entries``.
- ``braid_bookkeeping_queued``, ``braid_bookkeeping_written_total``,
  ``braid_bookkeeping_dropped_total{reason}`` (``queue_full``, ``write_failed``).
- ``braid_memories_swept_total``: expired memories this process's sweeper removed.
- ``process_*`` and ``python_gc_*``: the process's CPU, memory, descriptors.

With ``server.workers`` above 1 the service is several processes on one
port, and a scrape reaches one of them: each keeps its counts in the
directory ``PROMETHEUS_MULTIPROC_DIR`` names (set by the parent), and every
``/metrics`` answers with the sums over them (prometheus-client's
multiprocess mode). The counts each process reads from its runtime (the
second list above, Postgres' aside) are written there too, at least every
:data:`PUBLISH_S`, as gauges summed over the live processes (``*_up``: the
lowest); ``process_*`` and ``python_gc_*`` are left out (they are per process).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import anyio
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send
from prometheus_client import CollectorRegistry, Counter, Gauge, GCCollector, Histogram, ProcessCollector
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from indexers.base import BackendError, postgres_errors
from indexers.postgres import PING_TIMEOUT_S, Written
from indexers.results import RecallResult

if TYPE_CHECKING:
    from indexers.runtime import Runtime

__all__ = ["Metrics"]

log = logging.getLogger("braid.metrics")

#: How often a process of a multi-process service writes the counts it reads
#: from its runtime to the shared directory (seconds).
PUBLISH_S = 1.0

#: Request durations: 1 ms to 10 s.
HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: A source's search or the query embedding: 0.5 ms (a cached embedding) to 5 s.
SOURCE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

#: Source statuses of a source that searched (its time is observed).
_SEARCHED = frozenset({"ok", "timeout", "error"})
#: Embedding statuses of a recall that did not embed its query (no time observed).
_NOT_EMBEDDED = frozenset({"client", "none"})


class _Scrape:
    """One scrape's view: the registry's metrics, then those read just now."""

    def __init__(self, registry: CollectorRegistry, read: list[Metric]) -> None:
        self._registry = registry
        self._read = read

    def collect(self) -> Iterator[Metric]:
        yield from self._registry.collect()
        yield from self._read


class Metrics:
    """This app's metrics: record with :meth:`request`, :meth:`recalled` and
    :meth:`wrote`; :meth:`exposition` answers a scrape."""

    def __init__(self) -> None:
        #: One of several service processes, counting in PROMETHEUS_MULTIPROC_DIR.
        self.shared = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self.registry = CollectorRegistry()
        if not self.shared:
            ProcessCollector(registry=self.registry)
            GCCollector(registry=self.registry)
        #: The gauges the runtime's counts are written to when ``shared``, by sample name.
        self._published: dict[str, Gauge] = {}
        r = self.registry
        self._requests = Histogram(
            "braid_http_request_duration_seconds",
            "Requests that matched a route, by route template, method and status class, "
            "timed from routing to the answer's last byte",
            ("route", "method", "status_class"),
            registry=r,
            buckets=HTTP_BUCKETS,
        )
        self._errors = Counter(
            "braid_http_errors",
            "Answers with a status >= 400, by route template, method and status",
            ("route", "method", "status"),
            registry=r,
        )
        self._recalls = Counter(
            "braid_recalls",
            "Recalls answered, by the strategy that ran and whether the result cache served it",
            ("strategy", "cached"),
            registry=r,
        )
        self._served = Counter(
            "braid_recalls_served",
            "Recalls answered, by the Postgres they read: `replica` (postgres.replicaDsn, once it had "
            "replayed the tenant's writes) or `primary`",
            ("by",),
            registry=r,
        )
        self._degraded = Counter(
            "braid_recall_degraded", "Recalls with a degraded part (a source or the query embedding)", registry=r
        )
        self._source_seconds = Histogram(
            "braid_source_duration_seconds",
            "A source's search in a recall, or the recall's query embedding (source `embedding`), when it ran",
            ("source",),
            registry=r,
            buckets=SOURCE_BUCKETS,
        )
        self._outcomes = Counter(
            "braid_source_outcomes",
            "Per computed recall, each source's status (`embedding`: the embedding_status)",
            ("source", "outcome"),
            registry=r,
        )
        self._written = Counter("braid_memories_written", "Memories written (inserted or replaced)", registry=r)
        self._superseded = Counter(
            "braid_memories_superseded", "Memories a newer version of their mem_key retired", registry=r
        )
        #: The runtime read at scrape time; None until the app has started.
        self.runtime: Runtime | None = None
        self._postgres_failing = False

    # --- recorded as requests are served ---------------------------------------

    def middleware(self, app: ASGIApp) -> ASGIApp:
        """The ASGI middleware timing every request of ``app`` (a routed handler)."""
        observe = self.request

        async def timed(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != ScopeType.HTTP:
                await app(scope, receive, send)
                return
            start = time.perf_counter()
            status = 500

            async def sent(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                await send(message)

            try:
                await app(scope, receive, sent)
            finally:
                observe(scope["path_template"], scope["method"], status, time.perf_counter() - start)

        return timed

    def request(self, route: str, method: str, status: int, seconds: float) -> None:
        self._requests.labels(route, method, f"{status // 100}xx").observe(seconds)
        if status >= 400:
            self._errors.labels(route, method, str(status)).inc()

    def recalled(self, result: RecallResult) -> None:
        self._recalls.labels(result.strategy, "true" if result.cached else "false").inc()
        self._served.labels(result.served_by).inc()
        if result.degraded:
            self._degraded.inc()
        if result.cached:
            # Its sources' times are those of the recall that computed it.
            return
        for name, source in result.sources.items():
            self._outcomes.labels(name, source.status).inc()
            if source.status in _SEARCHED:
                self._source_seconds.labels(name).observe(source.ms / 1000.0)
        self._outcomes.labels("embedding", result.embedding_status).inc()
        if result.embedding_status not in _NOT_EMBEDDED:
            self._source_seconds.labels("embedding").observe(result.embedding_ms / 1000.0)

    def wrote(self, written: Written) -> None:
        self._written.inc(len(written.ids))
        if written.superseded:
            self._superseded.inc(len(written.superseded))

    # --- a scrape --------------------------------------------------------------

    async def exposition(self, accept: str) -> tuple[bytes, str]:
        """The body and content type answering a scrape with this ``Accept`` header."""
        encode, content_type = choose_encoder(accept)
        read = await self._read() if self.runtime is not None else []
        if not self.shared:
            return encode(_Scrape(self.registry, [*read, *self._local()])), content_type
        from prometheus_client import multiprocess

        self.publish()
        summed = CollectorRegistry()
        multiprocess.MultiProcessCollector(summed)  # type: ignore[no-untyped-call]
        return encode(_Scrape(summed, read)), content_type

    def publish(self) -> None:
        """Write the counts this process reads from its runtime to the shared
        directory (when ``shared``), as gauges summed over the live processes."""
        if not self.shared or self.runtime is None:
            return
        for family in self._local():
            for sample in family.samples:
                gauge = self._published.get(sample.name)
                if gauge is None:
                    gauge = self._published[sample.name] = Gauge(
                        sample.name,
                        family.documentation,
                        tuple(sample.labels),
                        registry=None,
                        multiprocess_mode="livemin" if family.name.endswith("_up") else "livesum",
                    )
                (gauge.labels(**sample.labels) if sample.labels else gauge).set(sample.value)

    async def publishing(self) -> None:
        """:meth:`publish` every :data:`PUBLISH_S` seconds, until cancelled."""
        while True:
            self.publish()
            await anyio.sleep(PUBLISH_S)

    async def _read(self) -> list[Metric]:
        """What a scrape reads from Postgres: the same whichever process reads it."""
        assert self.runtime is not None
        rt = self.runtime
        read: list[Metric] = []
        backlog = active = None
        with anyio.move_on_after(PING_TIMEOUT_S):
            try:
                with postgres_errors("read"):
                    backlog = await rt.sync.backlog()
                    active = await rt.jobs.active()
            except BackendError as exc:
                if not self._postgres_failing:
                    log.warning("metrics: Postgres did not answer the outbox query: %s", exc)
                self._postgres_failing = True
        up = backlog is not None and active is not None
        if up:
            self._postgres_failing = False
        read.append(_gauge("braid_postgres_up", "1 when Postgres answered this scrape's queries within 2 s", up))
        if backlog is not None and active is not None:
            pending, lag = backlog
            read += [
                _gauge("braid_outbox_pending", "Outbox rows not yet applied to Typesense (every tenant)", pending),
                _gauge(
                    "braid_outbox_lag_seconds",
                    "Age of the oldest outbox row not yet applied to Typesense; 0 when none is",
                    lag,
                ),
                _gauge("braid_reindex_jobs_active", "Reindex jobs queued or running (any process)", active),
            ]
        return read

    def _local(self) -> list[Metric]:
        """What this process counts in its runtime (none before it started)."""
        if self.runtime is None:
            return []
        rt = self.runtime
        read: list[Metric] = [
            _counter("braid_outbox_applied", "Outbox rows this process's worker applied to Typesense", rt.sync.applied),
            _gauge(
                "braid_outbox_sync_up",
                "1 while this process's outbox worker applies rows, 0 while it retries (Typesense unreachable)",
                rt.sync.last_error is None,
            ),
        ]
        read += _embedding_cache(rt.embedder)
        names = rt.engine.names
        read += [
            _counter("braid_name_vectors_hits", "Entity names whose vector was cached (any tenant's)", names.hits),
            _counter("braid_name_vectors_misses", "Entity names embedded: the cache did not hold them", names.misses),
        ]
        cache = rt.engine.cache.stats()
        read += [
            _counter("braid_recall_cache_hits", "Recalls answered from the result cache (cache.ttlMs)", cache.hits),
            _counter("braid_recall_cache_misses", "Recalls the result cache could not answer", cache.misses),
            _gauge("braid_recall_cache_entries", "Answers in the result cache", cache.entries),
        ]
        books = rt.bookkeeper.stats()
        dropped = CounterMetricFamily(
            "braid_bookkeeping_dropped",
            "Returned memories whose use was not counted: the queue was full (queue_full), "
            "or Postgres refused or did not answer the batch (write_failed)",
            labels=("reason",),
        )
        dropped.add_metric(("queue_full",), books.dropped)
        dropped.add_metric(("write_failed",), books.failed)
        read += [
            _gauge("braid_bookkeeping_queued", "Returned memories waiting to be counted", books.queued),
            _counter("braid_bookkeeping_written", "Returned memories whose use was counted", books.written),
            dropped,
        ]
        if rt.engine.replica is not None:
            replica = rt.engine.replica.router.stats()
            read += [
                _gauge(
                    "braid_replica_up",
                    "1 while recalls may read the streaming replica (postgres.replicaDsn), 0 while it is out",
                    replica.status == "up",
                ),
                _counter(
                    "braid_replica_fallbacks",
                    "Recalls begun on the replica that a failed read answered from the primary",
                    replica.fallbacks,
                ),
            ]
        sweep = rt.sweeper.stats()
        read.append(_counter("braid_memories_swept", "Expired memories this process's sweeper removed", sweep.swept))
        return read


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=float(value))


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=float(value))


def _embedding_cache(embedder: object) -> Iterable[Metric]:
    """The query-embedding cache's counts, when the embedder keeps one."""
    stats = getattr(embedder, "cache_stats", None)
    if callable(stats):
        stats = stats()
    if not isinstance(stats, dict):
        return []
    return [
        _counter("braid_embedding_cache_hits", "Query embeddings found in the cache", stats.get("hits", 0)),
        _counter("braid_embedding_cache_misses", "Query embeddings the cache did not hold", stats.get("misses", 0)),
    ]
