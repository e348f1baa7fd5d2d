"""``GET /metrics`` on the real stack: what one write and one recall leave in
it, degraded and failed sources, errors, the result cache, bookkeeping drops,
the ``metrics`` config section, and the Grafana dashboard's queries against
what the endpoint exposes."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from config import BraidConfig, MetricsConfig
from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense
from indexers.base import SearchQuery, SourceUnavailable

from . import conftest
from .conftest import ADMIN_A, AGENT_A, Braid, FileConfigured, make_app, serve

pytestmark = pytest.mark.anyio

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "braid-dashboard.json"
SOURCES = ("typesense", "pgvector", "graph")
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
def stack(postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any) -> Callable[..., Any]:
    """``stack(**changes)``: a served Braid whose config is the patient test
    config with ``changes`` (BraidConfig fields), as an async context."""

    @asynccontextmanager
    async def start(edit: Callable[[BraidConfig], BraidConfig] = lambda c: c) -> AsyncIterator[Braid]:
        cfg = edit(conftest.patient(conftest.test_config("unused")))
        app, dsn, alias = make_app(postgres, typesense, embedder, cfg)
        async with serve(app) as client:
            yield Braid(client=client, app=app, dsn=dsn, alias=alias)

    return start


def with_metrics(**changes: Any) -> Callable[[BraidConfig], BraidConfig]:
    return lambda cfg: msgspec.structs.replace(cfg, metrics=MetricsConfig(**changes))


async def scrape(braid: Braid, path: str = "/metrics", key: str | None = None) -> tuple[str, Samples]:
    headers = braid.headers(key) if key else {}
    r = await braid.client.get(path, headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    samples: Samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return r.text, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in samples, f"no sample {name}{labels}; have {sorted(k for k in samples if k[0] == name)}"
    return samples[key]


def request_count(samples: Samples, route: str, method: str, status_class: str) -> float:
    return samples.get(
        (
            "braid_http_request_duration_seconds_count",
            frozenset({"route": route, "method": method, "status_class": status_class}.items()),
        ),
        0.0,
    )


async def test_one_write_and_one_recall_show_every_metric(stack: Callable[..., Any]) -> None:
    async with stack() as braid:
        secret = f"Orchid-{uuid.uuid4().hex[:8]} is the vault passphrase"
        await braid.remember({"content": secret, "mem_key": "vault.passphrase"})
        await braid.synced()
        cache_before = braid.runtime.embedder.cache_stats
        query = f"what is the vault passphrase {uuid.uuid4().hex[:6]}"
        out = await braid.recall(query)
        assert out["degraded"] == []
        assert out["items"][0]["content"] == secret
        # The recall's one returned memory counted, off the request path.
        with anyio.fail_after(10):
            while braid.runtime.bookkeeper.stats().written < 1:
                await anyio.sleep(0.01)

        text, samples = await scrape(braid)

        # Requests: one write, one recall, by route template, method and status class.
        assert request_count(samples, "/v1/memories", "POST", "2xx") == 1
        assert request_count(samples, "/v1/recall", "POST", "2xx") == 1
        assert value(samples, "braid_memories_written_total") == 1
        assert value(samples, "braid_memories_superseded_total") == 0
        # The recall: each source and the query embedding searched once, ok.
        assert value(samples, "braid_recalls_total", strategy="auto", cached="false") == 1
        assert value(samples, "braid_recall_degraded_total") == 0
        for source in (*SOURCES, "embedding"):
            assert value(samples, "braid_source_outcomes_total", source=source, outcome="ok") == 1
            assert value(samples, "braid_source_duration_seconds_count", source=source) == 1
            seconds = value(samples, "braid_source_duration_seconds_sum", source=source)
            # The time the recall reported for it, in seconds.
            ms = out["embedding_ms"] if source == "embedding" else out["sources"][source]["ms"]
            assert seconds == pytest.approx(ms / 1000.0)
            assert value(samples, "braid_source_duration_seconds_bucket", source=source, le="+Inf") == 1
        # Read at scrape time: the outbox (drained), the caches, bookkeeping, the sweeper.
        assert value(samples, "braid_postgres_up") == 1
        assert value(samples, "braid_outbox_pending") == 0
        assert value(samples, "braid_outbox_lag_seconds") == 0
        assert value(samples, "braid_outbox_applied_total") >= 1
        assert value(samples, "braid_outbox_sync_up") == 1
        assert value(samples, "braid_reindex_jobs_active") == 0
        cache_after = braid.runtime.embedder.cache_stats
        assert cache_after == {"hits": cache_before["hits"], "misses": cache_before["misses"] + 1}
        assert value(samples, "braid_embedding_cache_misses_total") == cache_after["misses"]
        assert value(samples, "braid_embedding_cache_hits_total") == cache_after["hits"]
        names = braid.runtime.engine.names
        assert value(samples, "braid_name_vectors_hits_total") == names.hits
        assert value(samples, "braid_name_vectors_misses_total") == names.misses
        assert value(samples, "braid_recall_cache_hits_total") == 0
        assert value(samples, "braid_recall_cache_entries") == 0
        assert value(samples, "braid_bookkeeping_dropped_total", reason="queue_full") == 0
        assert value(samples, "braid_bookkeeping_dropped_total", reason="write_failed") == 0
        assert value(samples, "braid_bookkeeping_queued") == 0
        assert value(samples, "braid_bookkeeping_written_total") == 1
        assert value(samples, "braid_memories_swept_total") == 0
        assert value(samples, "process_cpu_seconds_total") > 0
        assert not any(name == "braid_http_errors_total" for name, _ in samples)
        # Nothing of the tenant's: no tenant name, memory, query or key.
        for private in ("tenant-a", secret.split()[0], query.split()[-1], "vault", AGENT_A):
            assert private not in text


async def test_pending_outbox_rows_show_as_pending_and_lag(stack: Callable[..., Any]) -> None:
    async with stack() as braid:

        async def typesense_refuses(*_: Any, **__: Any) -> None:
            raise SourceUnavailable("typesense", "refused by the test")

        # Typesense "down" for the worker: the write's outbox row stays pending.
        braid.runtime.sync.apply = typesense_refuses  # type: ignore[method-assign]
        await braid.remember({"content": "Written while the outbox cannot drain"})
        with anyio.fail_after(10):
            while braid.runtime.sync.last_error is None:
                await anyio.sleep(0.01)
        _, samples = await scrape(braid)
        assert value(samples, "braid_outbox_pending") == 1
        assert value(samples, "braid_outbox_lag_seconds") > 0
        assert value(samples, "braid_outbox_sync_up") == 0


async def test_failed_and_late_sources_count_as_degraded(stack: Callable[..., Any]) -> None:
    # pgvector's deadline short, its search stalled for good: a timeout every time.
    async with stack(lambda cfg: cfg.with_source("pgvector", deadline_ms=50)) as braid:
        await braid.remember({"content": "The deploy key rotates on Fridays"})
        await braid.synced()
        sources = braid.runtime.engine.sources

        async def refused(query: SearchQuery) -> list[Any]:
            raise SourceUnavailable("graph", "refused by the test")

        async def stalled(query: SearchQuery) -> list[Any]:
            await anyio.sleep(3600)
            return []

        sources["graph"].search = refused  # type: ignore[method-assign]
        out = await braid.recall("when does the deploy key rotate")
        assert out["degraded"] == ["graph"]
        sources["pgvector"].search = stalled  # type: ignore[method-assign]
        out = await braid.recall("when does the deploy key rotate")
        assert out["degraded"] == ["pgvector", "graph"]
        assert out["sources"]["pgvector"]["status"] == "timeout"

        _, samples = await scrape(braid)
        assert value(samples, "braid_recalls_total", strategy="auto", cached="false") == 2
        assert value(samples, "braid_recall_degraded_total") == 2
        assert value(samples, "braid_source_outcomes_total", source="graph", outcome="error") == 2
        assert value(samples, "braid_source_outcomes_total", source="pgvector", outcome="ok") == 1
        assert value(samples, "braid_source_outcomes_total", source="pgvector", outcome="timeout") == 1
        assert value(samples, "braid_source_outcomes_total", source="typesense", outcome="ok") == 2
        # A failed or late source still ran: its time is observed (a late one, about its deadline).
        assert value(samples, "braid_source_duration_seconds_count", source="graph") == 2
        assert value(samples, "braid_source_duration_seconds_count", source="pgvector") == 2
        assert value(samples, "braid_source_duration_seconds_bucket", source="pgvector", le="0.025") <= 1


async def test_strategies_and_skipped_sources(stack: Callable[..., Any]) -> None:
    async with stack() as braid:
        await braid.remember({"content": "Sam's locker code is 4471", "session_id": "s-1"})
        await braid.synced()
        await braid.recall("locker code", strategy="keyword")
        await braid.recall("", strategy="recent", session_id="s-1")
        _, samples = await scrape(braid)
        assert value(samples, "braid_recalls_total", strategy="keyword", cached="false") == 1
        assert value(samples, "braid_recalls_total", strategy="recent", cached="false") == 1
        assert value(samples, "braid_source_outcomes_total", source="pgvector", outcome="skipped") == 2
        assert value(samples, "braid_source_outcomes_total", source="typesense", outcome="ok") == 1
        assert value(samples, "braid_source_outcomes_total", source="typesense", outcome="skipped") == 1
        assert value(samples, "braid_source_outcomes_total", source="embedding", outcome="none") == 2
        # Only the sources that searched are timed; no query was embedded.
        assert value(samples, "braid_source_duration_seconds_count", source="typesense") == 1
        assert ("braid_source_duration_seconds_count", frozenset({("source", "pgvector")})) not in samples
        assert ("braid_source_duration_seconds_count", frozenset({("source", "embedding")})) not in samples


async def test_errors_are_counted_by_route_and_status(stack: Callable[..., Any]) -> None:
    async with stack() as braid:
        assert (await braid.post("/v1/recall", {"query": "x", "top_k": 0})).status_code == 400
        assert (await braid.client.post("/v1/recall", json={"query": "x"})).status_code == 401
        assert (await braid.client.get("/v1/memories/nope", headers=braid.headers(AGENT_A))).status_code == 404
        assert (await braid.client.get("/admin/stats", headers=braid.headers(AGENT_A))).status_code == 403
        _, samples = await scrape(braid)
        errors = {
            (dict(labels)["route"], dict(labels)["status"]): v
            for (name, labels), v in samples.items()
            if name == "braid_http_errors_total"
        }
        assert errors == {
            ("/v1/recall", "400"): 1,
            ("/v1/recall", "401"): 1,
            ("/v1/memories/{memory_id}", "404"): 1,
            ("/admin/stats", "403"): 1,
        }
        assert request_count(samples, "/v1/recall", "POST", "4xx") == 2
        assert request_count(samples, "/v1/memories/{memory_id}", "GET", "4xx") == 1
        # A recall that never reached the engine is not a recall.
        assert not any(name == "braid_recalls_total" for name, _ in samples)


async def test_a_cached_recall_counts_as_a_recall_not_as_searches(stack: Callable[..., Any]) -> None:
    cached = lambda cfg: msgspec.structs.replace(cfg, cache=msgspec.structs.replace(cfg.cache, ttl_ms=60_000))  # noqa: E731
    async with stack(cached) as braid:
        await braid.remember({"content": "The boiler was serviced in March"})
        await braid.synced()
        first = await braid.recall("when was the boiler serviced")
        second = await braid.recall("when was the boiler serviced")
        assert (first["cached"], second["cached"]) == (False, True)
        _, samples = await scrape(braid)
        assert value(samples, "braid_recalls_total", strategy="auto", cached="false") == 1
        assert value(samples, "braid_recalls_total", strategy="auto", cached="true") == 1
        assert value(samples, "braid_recall_cache_hits_total") == 1
        assert value(samples, "braid_recall_cache_entries") == 1
        for source in (*SOURCES, "embedding"):
            assert value(samples, "braid_source_outcomes_total", source=source, outcome="ok") == 1


async def test_bookkeeping_drops_are_counted(stack: Callable[..., Any]) -> None:
    tiny = lambda cfg: msgspec.structs.replace(  # noqa: E731
        cfg, bookkeeping=msgspec.structs.replace(cfg.bookkeeping, queue_size=1)
    )
    async with stack(tiny) as braid:
        await braid.remember({"content": "Mia likes green tea"}, {"content": "Mia dislikes coffee"})
        await braid.synced()
        out = await braid.recall("what does Mia drink")
        assert len(out["items"]) == 2
        _, samples = await scrape(braid)
        # Two returned memories, a queue of one: both dropped, as /health says.
        assert value(samples, "braid_bookkeeping_dropped_total", reason="queue_full") == 2
        health = (await braid.client.get("/health")).json()
        assert health["bookkeeping"]["dropped"] == 2


async def test_superseded_memories_are_counted(stack: Callable[..., Any]) -> None:
    async with stack() as braid:
        await braid.remember({"content": "Sam lives in Lisbon", "mem_key": "home"})
        await braid.remember({"content": "Sam lives in Porto", "mem_key": "home"})
        _, samples = await scrape(braid)
        assert value(samples, "braid_memories_written_total") == 2
        assert value(samples, "braid_memories_superseded_total") == 1


async def test_openmetrics_when_the_scraper_asks(stack: Callable[..., Any]) -> None:
    async with stack() as braid:
        r = await braid.client.get("/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"})
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
        assert r.text.endswith("# EOF\n")


async def test_admin_auth(stack: Callable[..., Any]) -> None:
    async with stack(with_metrics(auth="admin")) as braid:
        r = await braid.client.get("/metrics")
        assert r.status_code == 401
        assert r.json()["detail"] == "missing API key: send `Authorization: Bearer <key>`"
        r = await braid.client.get("/metrics", headers=braid.headers(AGENT_A))
        assert r.status_code == 403
        assert r.json()["detail"] == "this endpoint needs an admin key"
        _, samples = await scrape(braid, key=ADMIN_A)
        assert request_count(samples, "/metrics", "GET", "4xx") == 2


async def test_another_path(stack: Callable[..., Any]) -> None:
    async with stack(with_metrics(path="/internal/prometheus")) as braid:
        assert (await braid.client.get("/metrics")).status_code == 404
        _, samples = await scrape(braid, "/internal/prometheus")
        assert value(samples, "braid_postgres_up") == 1


async def test_disabled(stack: Callable[..., Any]) -> None:
    async with stack(with_metrics(enabled=False)) as braid:
        assert braid.runtime.engine.observer is None
        await braid.remember({"content": "Nothing is counted here"})
        await braid.recall("counted")
        assert (await braid.client.get("/metrics")).status_code == 404


async def test_a_reload_leaves_metrics_as_they_started(configured: FileConfigured) -> None:
    configured.write("metrics:\n  path: /elsewhere\n")
    r = await configured.reload()
    assert r.status_code == 200, r.text
    assert r.json()["restart_required"] == ["metrics.path"]
    assert (await configured.braid.client.get("/metrics")).status_code == 200
    assert (await configured.braid.client.get("/elsewhere")).status_code == 404


# --- the Grafana dashboard ------------------------------------------------------

#: Labels Prometheus adds to every scraped series.
SCRAPE_LABELS = {"instance", "job"}
METRIC = re.compile(r"\b((?:braid|process|python)_[a-z0-9_]+)\b(?:\{([^}]*)\})?")
BY = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def exposed(text: str) -> dict[str, set[str]]:
    """Every series name the exposition can hold, with its label names: a
    family with no sample yet (an error counter before any error) counts by
    the names its type gives its samples."""
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created")}
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for suffix in suffixes.get(family.type, ("",)):
            names.setdefault(family.name + suffix, set())
        for s in family.samples:
            names.setdefault(s.name, set()).update(s.labels)
    return names


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # collapsed rows hold theirs
    return out


async def test_the_grafana_dashboard_queries_what_metrics_exposes(stack: Callable[..., Any]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert dashboard["title"] == "Braid"
    assert dashboard["uid"]
    graphs = [p for p in panels(dashboard) if p["type"] != "row"]
    assert len(graphs) >= 10
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids repeat"

    async with stack() as braid:
        await braid.remember({"content": "A memory so every series has a sample"})
        await braid.synced()
        await braid.recall("a memory")
        await braid.client.post("/v1/recall", json={"query": "no key"})
        text, _ = await scrape(braid)
    names = exposed(text)

    used: set[str] = set()
    for panel in graphs:
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        assert panel["gridPos"]["w"] > 0 and panel["gridPos"]["h"] > 0
        for target in panel["targets"]:
            expr = target["expr"]
            assert target["refId"]
            found = METRIC.findall(expr)
            assert found, f"{panel['title']!r}: no Braid metric in {expr!r}"
            labels_here: set[str] = set()
            for name, selector in found:
                assert name in names, f"{panel['title']!r} queries {name}, which /metrics does not expose"
                used.add(name)
                labels_here |= names[name]
                for label in re.findall(r"([a-z_]+)\s*(?:=~|!~|!=|=)", selector):
                    assert label in names[name] | SCRAPE_LABELS, f"{name} has no label {label!r} ({expr!r})"
            for group in BY.findall(expr):
                for label in (g.strip() for g in group.split(",") if g.strip()):
                    assert label in labels_here | SCRAPE_LABELS | {"le"}, f"no label {label!r} in {expr!r}"
    # The panels the brief asks for are there.
    for name in (
        "braid_http_request_duration_seconds_bucket",
        "braid_http_errors_total",
        "braid_source_duration_seconds_bucket",
        "braid_source_outcomes_total",
        "braid_recall_degraded_total",
        "braid_outbox_pending",
        "braid_outbox_lag_seconds",
        "braid_embedding_cache_hits_total",
        "braid_bookkeeping_dropped_total",
    ):
        assert name in used, f"the dashboard does not show {name}"
