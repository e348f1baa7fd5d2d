"""OpenTelemetry traces on the real stack: with ``traces.enabled`` one recall
makes one ``braid.recall`` span with a child per source and the query
embedding (collected by the SDK's in-memory exporter through the process's
tracer provider, ``exporter: global``, or sent over OTLP/HTTP to a receiver
that decodes the protobuf); with traces off no span is made, and nothing of
Braid imports OpenTelemetry."""

from __future__ import annotations

import gzip
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from config import BraidConfig, ConfigError, TracesConfig
from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense
from indexers.base import SearchQuery, SourceUnavailable

from . import conftest
from .conftest import Braid, make_app, serve

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ["graph", "pgvector", "typesense"]


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    """Every span the process's tracer provider ends, from now on (the global
    provider can be set once per process: one is made if none is)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    assert isinstance(trace.get_tracer_provider(), TracerProvider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()


@pytest.fixture
def stack(postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any) -> Callable[..., Any]:
    """``stack(traces)``: a served Braid with this ``traces`` section and
    deadlines a loaded machine cannot miss."""

    @asynccontextmanager
    async def start(traces: TracesConfig, **changes: Any) -> AsyncIterator[Braid]:
        cfg: BraidConfig = msgspec.structs.replace(conftest.patient(conftest.test_config("unused")), traces=traces)
        app, dsn, alias = make_app(postgres, typesense, embedder, cfg)
        async with serve(app) as client:
            yield Braid(client=client, app=app, dsn=dsn, alias=alias)

    return start


GLOBAL = TracesConfig(enabled=True, exporter="global")


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return {k: (tuple(v) if isinstance(v, tuple | list) else v) for k, v in (span.attributes or {}).items()}


def tree(finished: tuple[ReadableSpan, ...]) -> tuple[ReadableSpan, list[ReadableSpan]]:
    """The one recall span and its children; fails if there is anything else."""
    recalls = [s for s in finished if s.name == "braid.recall"]
    assert len(recalls) == 1, [s.name for s in finished]
    (recall,) = recalls
    assert recall.parent is None
    children = [s for s in finished if s.parent is not None and s.parent.span_id == recall.context.span_id]
    assert len(children) == len(finished) - 1, [s.name for s in finished]
    assert {s.context.trace_id for s in finished} == {recall.context.trace_id}
    return recall, children


async def test_one_recall_span_with_a_child_per_source(stack: Callable[..., Any], spans: InMemorySpanExporter) -> None:
    async with stack(GLOBAL) as braid:
        await braid.remember({"content": "The staging database lives in Frankfurt"})
        await braid.synced()
        spans.clear()
        out = await braid.recall("where is the staging database")
        finished = spans.get_finished_spans()

    recall, children = tree(finished)
    assert attributes(recall) == {
        "braid.strategy": "auto",
        "braid.cached": False,
        "braid.hits": len(out["items"]),
        "braid.degraded": False,
        "braid.degraded_parts": (),
        "braid.embedding_status": "ok",
    }
    assert recall.status.status_code == StatusCode.UNSET
    sources = sorted((s for s in children if s.name == "braid.source"), key=lambda s: attributes(s)["braid.source"])
    assert [attributes(s) for s in sources] == [
        {"braid.source": name, "braid.status": "ok", "braid.hits": out["sources"][name]["hits"]} for name in SOURCES
    ]
    (embedding,) = [s for s in children if s.name == "braid.embedding"]
    assert attributes(embedding) == {"braid.status": "ok"}
    assert len(children) == 4
    # Each child lies inside its parent, and the embedding comes before the searches.
    for child in children:
        assert recall.start_time <= child.start_time <= child.end_time <= recall.end_time
    assert embedding.end_time <= min(s.start_time for s in sources)
    # Nothing of the tenant's in any span.
    for span in finished:
        text = repr(span.to_json())
        for private in ("tenant-a", "staging", "Frankfurt"):
            assert private not in text


async def test_a_failed_source_marks_its_span_and_the_recall(
    stack: Callable[..., Any], spans: InMemorySpanExporter
) -> None:
    async with stack(GLOBAL) as braid:
        await braid.remember({"content": "The staging database lives in Frankfurt"})
        await braid.synced()

        async def refused(query: SearchQuery) -> list[Any]:
            raise SourceUnavailable("graph", "refused by the test, tenant-a")

        braid.runtime.engine.sources["graph"].search = refused  # type: ignore[method-assign]
        spans.clear()
        out = await braid.recall("where is the staging database")
        assert out["degraded"] == ["graph"]
        finished = spans.get_finished_spans()

    recall, children = tree(finished)
    assert attributes(recall)["braid.degraded"] is True
    assert attributes(recall)["braid.degraded_parts"] == ("graph",)
    (graph,) = [s for s in children if attributes(s).get("braid.source") == "graph"]
    assert attributes(graph) == {"braid.source": "graph", "braid.status": "error", "braid.hits": 0}
    assert (graph.status.status_code, graph.status.description) == (StatusCode.ERROR, "error")
    # The error's text is the tenant's business: not in the trace.
    assert "tenant-a" not in repr(graph.to_json())


async def test_a_recall_that_fails_is_an_error_span(stack: Callable[..., Any], spans: InMemorySpanExporter) -> None:
    async with stack(GLOBAL) as braid:

        async def down(*_: Any, **__: Any) -> Any:
            raise SourceUnavailable("postgres", "down for the test")

        braid.runtime.engine.store.recent = down  # type: ignore[method-assign]
        spans.clear()
        r = await braid.post("/v1/recall", {"strategy": "recent"})
        assert r.status_code == 503
        finished = spans.get_finished_spans()
    recall, children = tree(finished)
    assert children == []
    assert (recall.status.status_code, recall.status.description) == (StatusCode.ERROR, "SourceUnavailable")
    assert recall.events == ()  # no exception text recorded


async def test_off_makes_no_span(stack: Callable[..., Any], spans: InMemorySpanExporter) -> None:
    """Traces off (the default) while the process has a tracer provider that
    records everything: a write and a recall end no span."""
    async with stack(TracesConfig()) as braid:
        assert braid.runtime.engine.tracing is None
        await braid.remember({"content": "The staging database lives in Frankfurt"})
        spans.clear()
        await braid.recall("where is the staging database")
        assert spans.get_finished_spans() == ()


def test_off_does_not_load_opentelemetry() -> None:
    """The service, the engine and the sources import nothing of OpenTelemetry:
    with traces off it costs no import, and needs no ``traces`` extra."""
    code = (
        "import sys, service, service.app, service.metrics, indexers.engine, indexers.registry, indexers.runtime\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'opentelemetry'))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


OTLP_MODULE = "opentelemetry.exporter.otlp.proto.http.trace_exporter"


@pytest.mark.parametrize(
    ("missing", "traces"),
    [("opentelemetry", GLOBAL), (OTLP_MODULE, TracesConfig(enabled=True, exporter="otlp"))],
    ids=["no-opentelemetry", "no-otlp-exporter"],
)
async def test_enabled_without_the_extra_says_what_to_install(
    stack: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, missing: str, traces: TracesConfig
) -> None:
    # As if (part of) the `traces` extra were not installed.
    monkeypatch.setitem(sys.modules, missing, None)
    monkeypatch.delitem(sys.modules, "indexers.tracing", raising=False)
    # The app's start-up fails (inside the lifespan's task group).
    with pytest.RaisesGroup(ConfigError, flatten_subgroups=True) as info:
        async with stack(traces):
            pass
    (error,) = info.value.exceptions
    while isinstance(error, BaseExceptionGroup):
        (error,) = error.exceptions
    assert str(error) == f"traces.enabled needs OpenTelemetry ({missing} is not installed): pip install 'braid[traces]'"


class Receiver(ThreadingHTTPServer):
    """An OTLP/HTTP receiver on a free loopback port: keeps each export request, decoded."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.paths: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(handler) -> None:  # noqa: N805
                body = handler.rfile.read(int(handler.headers["content-length"]))
                if handler.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                assert handler.headers["content-type"] == "application/x-protobuf"
                self.requests.append(ExportTraceServiceRequest.FromString(body))
                self.paths.append(handler.path)
                handler.send_response(200)
                handler.send_header("content-type", "application/x-protobuf")
                handler.send_header("content-length", "0")
                handler.end_headers()

            def log_message(handler, *_: Any) -> None:  # noqa: N805
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1/traces"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


async def test_otlp_exporter_sends_the_spans(stack: Callable[..., Any], receiver: Receiver) -> None:
    traces = TracesConfig(enabled=True, exporter="otlp", endpoint=receiver.url, service_name="braid-test")
    async with stack(traces) as braid:
        await braid.remember({"content": "The staging database lives in Frankfurt"})
        await braid.synced()
        await braid.recall("where is the staging database")
    # The app has stopped: its provider flushed every span on the way out.
    await anyio.sleep(0)
    assert receiver.paths and set(receiver.paths) == {"/v1/traces"}
    names: list[str] = []
    services = set()
    for request in receiver.requests:
        for resource_spans in request.resource_spans:
            attrs = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            services.add(attrs["service.name"])
            for scope_spans in resource_spans.scope_spans:
                assert scope_spans.scope.name == "braid"
                names += [s.name for s in scope_spans.spans]
    assert services == {"braid-test"}
    assert sorted(names) == ["braid.embedding", "braid.recall", "braid.source", "braid.source", "braid.source"]


async def test_console_exporter_prints_the_spans(stack: Callable[..., Any], capsys: pytest.CaptureFixture[str]) -> None:
    async with stack(TracesConfig(enabled=True, exporter="console")) as braid:
        await braid.recall("anything at all")
    # Flushed as the app stopped: one JSON document per span.
    out = capsys.readouterr().out
    assert out.count('"name": "braid.recall"') == 1
    assert out.count('"name": "braid.source"') == 3
    assert out.count('"service.name": "braid"') == 5
