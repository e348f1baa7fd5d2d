"""OpenTelemetry traces of recalls (``traces.enabled``), and nothing at all when off.

Off (the default) the engine holds no :class:`Tracing` and each place that
would trace checks for ``None`` first: no span object is made, and nothing
imports this module, so OpenTelemetry is not even loaded (the ``traces``
extra need not be installed). On, each recall makes::

    braid.recall                  braid.strategy, braid.cached, braid.hits,
    |                             braid.degraded, braid.degraded_parts
    |-- braid.embedding           braid.status (ok, timeout, error): a recall that embedded its query
    |-- braid.source (typesense)  braid.source, braid.status, braid.hits
    |-- braid.source (pgvector)   ... one per source that searched
    `-- braid.source (graph)

A source span is the current span while the source searches, so spans an
instrumented client library makes (httpx, psycopg) nest under it. A failed or
late source, and a recall that raised, have the status ERROR with the
outcome or the exception's type as its description. Span names and attributes
never hold a tenant, a key, a query or a memory; no exception text is
recorded (it may quote a filter's values).

:func:`open_tracing` builds the tracer the config asks for and flushes its
spans on exit.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from typing import TYPE_CHECKING

import anyio
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from config import TracesConfig

if TYPE_CHECKING:
    from .registry import SourceResult
    from .results import RecallResult

__all__ = ["Tracing", "open_tracing"]

log = logging.getLogger("braid")

#: The instrumentation scope's name and version.
SCOPE = "braid"
VERSION = "0.1.0"


class Tracing:
    """Makes a recall's spans with ``tracer``."""

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer

    @contextmanager
    def _span(self, name: str, attributes: dict[str, str] | None = None) -> Iterator[Span]:
        with self._tracer.start_as_current_span(
            name, attributes=attributes, record_exception=False, set_status_on_exception=False
        ) as span:
            try:
                yield span
            except BaseException as exc:
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                raise

    def recall(self) -> AbstractContextManager[Span]:
        """The recall's span, current while the recall runs."""
        return self._span("braid.recall")

    def recalled(self, span: Span, result: RecallResult) -> None:
        span.set_attributes(
            {
                "braid.strategy": result.strategy,
                "braid.cached": result.cached,
                "braid.hits": len(result.items),
                "braid.degraded": bool(result.degraded),
                "braid.degraded_parts": list(result.degraded),
                "braid.embedding_status": result.embedding_status,
            }
        )

    def source(self, name: str) -> AbstractContextManager[Span]:
        """A source's span, current while it searches."""
        return self._span("braid.source", {"braid.source": name})

    def searched(self, span: Span, result: SourceResult) -> None:
        span.set_attributes({"braid.status": result.status, "braid.hits": len(result.hits)})
        if result.status != "ok":
            span.set_status(Status(StatusCode.ERROR, result.status))

    def embedded(self, ms: float, status: str) -> None:
        """The query embedding's span, which ended just now and took ``ms``."""
        end = time.time_ns()
        span = self._tracer.start_span("braid.embedding", start_time=end - int(ms * 1e6))
        span.set_attribute("braid.status", status)
        if status != "ok":
            span.set_status(Status(StatusCode.ERROR, status))
        span.end(end_time=end)


@asynccontextmanager
async def open_tracing(cfg: TracesConfig) -> AsyncIterator[Tracing]:
    """The :class:`Tracing` ``cfg`` asks for (``cfg.enabled`` is the caller's
    business). ``otlp`` and ``console`` get a tracer provider of their own
    (not the process's global one), whose spans are exported in batches off
    the request path and flushed on exit; ``global`` uses the process's."""
    if cfg.exporter == "global":
        if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            log.warning(
                "traces.exporter is `global` but this process has no tracer provider yet: "
                "spans go nowhere until one is set (opentelemetry-instrument, or trace.set_tracer_provider)"
            )
        yield Tracing(trace.get_tracer(SCOPE, VERSION))
        return

    from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    exporter: SpanExporter
    if cfg.exporter == "console":
        # The stdout of now (the exporter's default is the one of its import).
        exporter = ConsoleSpanExporter(out=sys.stdout)
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=cfg.endpoint)
    provider = TracerProvider(
        resource=Resource.create({SERVICE_NAME: cfg.service_name, SERVICE_VERSION: VERSION}),
        sampler=ParentBased(TraceIdRatioBased(cfg.sample_ratio)),
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    log.info("traces: %s exporter%s", cfg.exporter, f" to {cfg.endpoint}" if cfg.endpoint else "")
    try:
        yield Tracing(provider.get_tracer(SCOPE, VERSION))
    finally:
        # Flushes what is queued (blocking, bounded by the exporter's timeout).
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(provider.shutdown)
