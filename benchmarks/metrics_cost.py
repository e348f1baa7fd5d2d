"""CPU that metrics and traces add to one recall, in process.

``python -m benchmarks.metrics_cost``: an embedded Postgres and Typesense in a
temporary directory, then one app per mode (metrics off and traces off;
metrics on; metrics and traces on), each with the same 200 memories, driven
through its ASGI interface (httpx's ``ASGITransport``, no sockets) with
``--recalls`` identical fused recalls per round (one query: its embedding
comes from the cache, so the embedding thread does not run), the modes
alternating for ``--rounds`` rounds. CPU is this process's
(``time.process_time``: the app, the engine and the client; Postgres and
Typesense are other processes), per recall, the median over the rounds.
The difference between the modes is what metrics or traces cost; the
recording alone (:meth:`service.metrics.Metrics.recalled` and ``request``
for one recall's answer) is also timed on its own, in a tight loop.

Traces go to an SDK tracer provider whose batch processor hands them to an
exporter that drops them: the spans are made, sampled and queued as in
production, nothing is sent.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import msgspec

from config import ConfigHolder, MetricsConfig, TracesConfig, load_config
from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense
from indexers.runtime import Backends
from service import AppSettings, create_app
from service.auth import Keyring
from service.metrics import Metrics

from .common import write_results

KEY = "bench-agent-key-0123456789"
QUERY = "what does the user think about the database migration"
MODES = {
    "off": (MetricsConfig(enabled=False), TracesConfig()),
    "metrics": (MetricsConfig(), TracesConfig()),
    "metrics+traces": (MetricsConfig(), TracesConfig(enabled=True, exporter="global")),
}


def dropping_provider(batch: bool) -> Any:
    """An SDK tracer provider exporting into nothing, through a batch (as
    ``open_tracing`` sets up) or a simple (synchronous) span processor."""
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Drop(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop()) if batch else SimpleSpanProcessor(Drop()))
    return provider


async def round_of(
    pg: EmbeddedPostgres, ts: EmbeddedTypesense, embedder: Any, mode: str, recalls: int, db: int
) -> tuple[float, Any]:
    """CPU ms per recall in ``mode``, and one recall's answer (as the engine made it)."""
    import httpx

    metrics, traces = MODES[mode]
    cfg = load_config()
    cfg = msgspec.structs.replace(
        cfg,
        metrics=metrics,
        traces=traces,
        typesense=msgspec.structs.replace(cfg.typesense, collection=f"bench_{db}"),
        embedding=msgspec.structs.replace(cfg.embedding, query_deadline_ms=10_000),
    )
    for name in cfg.sources:
        cfg = cfg.with_source(name, deadline_ms=10_000)
    ring = Keyring()
    ring.add(KEY, tenant="bench", role="agent")
    dsn = pg.dsn().replace("/postgres?", f"/bench_{db}?")
    settings = AppSettings(
        config=ConfigHolder(cfg, None),
        backends=Backends(postgres_dsn=dsn, typesense_nodes=(ts.url,), typesense_api_key=ts.api_key),
        keyring=ring,
        embedder=embedder,
    )
    app = create_app(settings)
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"query": QUERY, "top_k": 10, "track": False}
    transport = httpx.ASGITransport(app=app)
    async with app.lifespan(), httpx.AsyncClient(transport=transport, base_url="http://b", timeout=60) as client:
        sync = app.state.runtime.sync
        while await sync.pending():
            await anyio.sleep(0.05)
        for _ in range(20):  # warm up: connections, caches
            r = await client.post("/v1/recall", json=body, headers=headers)
            assert r.status_code == 200 and not r.json()["degraded"], r.text
        start = time.process_time()
        for _ in range(recalls):
            r = await client.post("/v1/recall", json=body, headers=headers)
        used = time.process_time() - start
        assert r.status_code == 200, r.text
        result = await app.state.runtime.engine.recall("bench", _options(cfg))
    return used * 1000.0 / recalls, result


def _options(cfg: Any) -> Any:
    from service.schemas import RecallIn
    from service.validate import recall_options

    return recall_options(RecallIn(query=QUERY, top_k=10, track=False), cfg)


async def load(pg: EmbeddedPostgres, ts: EmbeddedTypesense, embedder: Any, db: int) -> None:
    """One database and collection with 200 memories, shared by every mode's app."""
    import httpx
    import psycopg

    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE bench_{db}")
    cfg = load_config()
    cfg = msgspec.structs.replace(
        cfg,
        metrics=MetricsConfig(enabled=False),
        typesense=msgspec.structs.replace(cfg.typesense, collection=f"bench_{db}"),
    )
    ring = Keyring()
    ring.add(KEY, tenant="bench", role="agent")
    settings = AppSettings(
        config=ConfigHolder(cfg, None),
        backends=Backends(
            postgres_dsn=pg.dsn().replace("/postgres?", f"/bench_{db}?"),
            typesense_nodes=(ts.url,),
            typesense_api_key=ts.api_key,
        ),
        keyring=ring,
        embedder=embedder,
    )
    app = create_app(settings)
    topics = ["database migration", "the frontend rewrite", "hiring", "the budget", "on-call", "the launch date"]
    memories = [
        {"content": f"Turn {i}: the user said something about {topics[i % len(topics)]} ({i})", "speaker": "user"}
        for i in range(200)
    ]
    transport = httpx.ASGITransport(app=app)
    async with app.lifespan(), httpx.AsyncClient(transport=transport, base_url="http://b", timeout=120) as client:
        r = await client.post("/v1/memories", json={"memories": memories}, headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 201, r.text


def recording_cost(result: Any, calls: int = 100_000) -> float:
    """µs of CPU that recording one recall takes: its answer and its request."""
    metrics = Metrics()
    start = time.process_time()
    for _ in range(calls):
        metrics.recalled(result)
        metrics.request("/v1/recall", "POST", 200, 0.012)
    return (time.process_time() - start) * 1e6 / calls


def tracing_cost(result: Any, calls: int = 20_000) -> float:
    """µs of CPU that one recall's five spans take (recall, embedding, three
    sources), each ended into a synchronous processor that drops it."""
    from indexers.registry import SourceResult
    from indexers.tracing import Tracing

    tracing = Tracing(dropping_provider(batch=False).get_tracer("braid"))
    searched = SourceResult(status="ok", ms=1.0)
    start = time.process_time()
    for _ in range(calls):
        with tracing.recall() as span:
            tracing.embedded(1.0, "ok")
            for name in ("typesense", "pgvector", "graph"):
                with tracing.source(name) as child:
                    tracing.searched(child, searched)
            tracing.recalled(span, result)
    return (time.process_time() - start) * 1e6 / calls


async def main_async(args: argparse.Namespace) -> str:
    from opentelemetry import trace

    from indexers.embedding import MiniLMEmbedder

    trace.set_tracer_provider(dropping_provider(batch=True))
    home = Path(tempfile.mkdtemp(prefix="braid-metrics-cost-"))
    home.chmod(0o755)
    pg, ts = EmbeddedPostgres(home / "postgres"), EmbeddedTypesense(home / "typesense")
    pg.start()
    ts.start()
    try:
        embedder = MiniLMEmbedder(cache_size=1024)
        embedder.load()
        await load(pg, ts, embedder, 1)
        per_mode: dict[str, list[float]] = {m: [] for m in MODES}
        result = None
        for n in range(args.rounds):
            for mode in MODES:
                ms, result = await round_of(pg, ts, embedder, mode, args.recalls, 1)
                per_mode[mode].append(ms)
                print(f"round {n + 1} {mode}: {ms:.3f} ms CPU per recall", flush=True)
        micro = recording_cost(result)
        spans = tracing_cost(result)
    finally:
        ts.stop()
        pg.stop(mode="immediate")
        shutil.rmtree(home, ignore_errors=True)
    base = statistics.median(per_mode["off"])
    lines = [
        "# CPU per recall: metrics and traces",
        "",
        f"`python -m benchmarks.metrics_cost --recalls {args.recalls} --rounds {args.rounds}`: fused recalls "
        "through the ASGI app in process (app, engine and httpx client; Postgres and Typesense are "
        "other processes), one cached query embedding, 200 memories; the median of the rounds.",
        "",
        "| mode | CPU ms per recall (median) | against off | rounds |",
        "|---|---|---|---|",
    ]
    for mode, values in per_mode.items():
        med = statistics.median(values)
        lines.append(f"| {mode} | {med:.3f} | {med - base:+.3f} | {', '.join(f'{v:.3f}' for v in values)} |")
    lines += [
        "",
        f"In a tight loop: recording one recall's metrics (its answer and its request) {micro:.1f} µs of CPU; "
        f"making one recall's five spans {spans:.1f} µs.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recalls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-write", action="store_true", help="print only; do not write benchmarks/results")
    args = parser.parse_args()
    report = anyio.run(main_async, args)
    print(report)
    if not args.no_write:
        print(write_results("metrics-cost", report))


if __name__ == "__main__":
    main()
