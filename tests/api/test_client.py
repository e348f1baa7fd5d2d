"""The Python client (``braid.Client``, ``braid.AsyncClient``) against a real
Braid served over a loopback socket (granian, the real Postgres and
Typesense): every endpoint, sync and async, typed answers; errors mapped with
the service's exact message; retries that honour ``Retry-After`` (a real 429
from the service's rate limit, a 503 injected in front of the real transport);
timeouts against a server that never answers; what is not retried."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import httpx
import msgspec
import psycopg
import pytest

import braid
from braid import _calls
from config import load_config
from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense

from . import conftest
from .conftest import ADMIN_A, AGENT_A, AGENT_B, make_app, patient
from .live import Live, live

T1 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
T2 = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def server(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Live]:
    """One served Braid for the module, its config a file (for reloads)."""
    path = tmp_path_factory.mktemp("client") / "braid.yaml"
    path.write_text("searchTopK: 10\n")
    app, dsn, alias = make_app(postgres, typesense, embedder, patient(load_config(path)), str(path))
    path.write_text(f"typesense:\n  collection: {alias}\nsearchTopK: 10\n")
    with live(app, dsn, alias) as srv:
        yield srv


@pytest.fixture
def client(server: Live) -> Iterator[braid.Client]:
    with braid.Client(server.url, AGENT_A) as c:
        yield c


@pytest.fixture
def admin(server: Live) -> Iterator[braid.Client]:
    with braid.Client(server.url, ADMIN_A) as c:
        yield c


# --- every endpoint, sync -----------------------------------------------------


def test_memories_write_read_versions_and_delete(client: braid.Client) -> None:
    written = client.remember(
        [
            "Sync user drives a Honda Civic",
            braid.Memory(content="Sam lives in Lisbon", id="sync-v1", mem_key="sync.city", created_at=T1),
            {"content": "Sam lives in Porto", "id": "sync-v2", "mem_key": "sync.city", "created_at": T2.isoformat()},
        ]
    )
    assert isinstance(written, braid.Written)
    assert written.ids[1:] == ["sync-v1", "sync-v2"]
    # A memory given without an id gets the client's UUID, so a retry replaces it.
    assert len(written.ids[0]) == 36 and written.ids[0].count("-") == 4
    assert written.superseded == ["sync-v1"]

    stored = client.memory(written.ids[0])
    assert isinstance(stored, braid.StoredMemory)
    assert (stored.content, stored.kind, stored.current) == ("Sync user drives a Honda Civic", "note", True)
    assert isinstance(stored.created_at, datetime)

    versions = client.versions("sync.city")
    assert [(v.id, v.current, v.superseded_by) for v in versions.memories] == [
        ("sync-v2", True, None),
        ("sync-v1", False, "sync-v2"),
    ]
    assert [v.id for v in client.versions("sync.city", limit=1).memories] == ["sync-v2"]

    deleted = client.delete_memory("sync-v2", restore_previous=True)
    assert deleted == braid.Deleted(deleted="sync-v2", restored="sync-v1")
    assert client.memory("sync-v1").current is True
    assert client.delete_memory(written.ids[0]) == braid.Deleted(deleted=written.ids[0], restored=None)


def test_recall_answers_with_the_block_and_each_items_ranks(client: braid.Client) -> None:
    client.remember(
        [
            braid.Memory(content="Recall user drives a red Mazda", id="rc-car", speaker="Alex", tags=("cars",)),
            braid.Memory(content="Recall user plays the cello", id="rc-music", tags=("music",)),
        ]
    )
    answer = client.recall("what car does the recall user drive", top_k=5, tags=["cars"], budget_tokens=300)
    assert isinstance(answer, braid.Recall)
    assert [i.id for i in answer.items] == ["rc-car"]
    item = answer.items[0]
    assert "Recall user drives a red Mazda" in answer.block
    assert item.in_block and not item.truncated
    assert item.speaker == "Alex"
    assert item.rrf_score == pytest.approx(sum(item.contributions.values()))
    product = 1.0
    for factor in item.factors.values():
        product *= factor
    assert item.score == pytest.approx(item.rrf_score * product)
    assert set(answer.sources) == {"typesense", "pgvector", "graph"}
    assert all(isinstance(s, braid.SourceReport) for s in answer.sources.values())
    assert answer.strategy == "auto" and answer.embedding_status == "ok"

    recent = client.recall(strategy="recent", tags=["music"])
    assert [i.id for i in recent.items] == ["rc-music"]
    assert recent.items[0].ranks == {"recent": 1}


def test_graph_write_and_deletes_with_names_that_need_encoding(client: braid.Client) -> None:
    written = client.write_graph(
        [braid.Entity(name="C/C++", type="language"), {"name": "Dana", "type": "person"}],
        [
            braid.Relation(source="Dana", relation="writes", target="C/C++", weight=2.0),
            {"source": "Dana", "relation": "reviews", "target": "C/C++"},
        ],
    )
    assert written == braid.GraphWritten(entities=2, relations=2)
    assert client.delete_relations("Dana", "C/C++", "writes") == braid.RelationsDeleted(deleted=1)
    with pytest.raises(braid.NotFound) as missing:
        client.delete_relations("Dana", "C/C++", "writes")
    assert missing.value.detail == "no 'writes' relation from 'Dana' to 'C/C++'"
    assert client.delete_entity("C/C++") == braid.EntityDeleted(deleted="C/C++", relations=1)
    with pytest.raises(braid.NotFound) as gone:
        client.delete_entity("C/C++")
    assert gone.value.detail == "no entity 'C/C++'"


def test_admin_reindex_follow_wait_stats_reload_health(admin: braid.Client, client: braid.Client) -> None:
    client.remember([f"Admin test memory number {i}" for i in range(3)])
    started = admin.start_reindex("typesense")
    assert isinstance(started, braid.JobStarted)
    states = list(admin.follow_reindex(started.job_id, poll_s=0.05))
    assert states[-1].finished and states[-1].status == "done"
    assert all(not s.finished for s in states[:-1])
    assert states[-1].progress["typesense"]["phase"] == "switched"
    job = admin.reindex_job(started.job_id)
    assert (job.job_id, job.target, job.status) == (started.job_id, "typesense", "done")

    second = admin.start_reindex("pgvector", tier="session")
    done = admin.wait_reindex(second.job_id, poll_s=0.05)
    assert (done.status, done.tier, done.progress["pgvector"]) == (
        "done",
        "session",
        {"done": 1, "total": 1, "tier": "session"},
    )
    graph = admin.wait_reindex(admin.start_reindex("graph").job_id, poll_s=0.05)
    assert (graph.status, graph.progress["graph"]["extractor"]) == ("done", "spacy")
    assert graph.progress["graph"]["done"] == graph.progress["graph"]["total"] >= 3
    # ``tenant`` reaches the service: only an import job takes one.
    with pytest.raises(braid.BadRequest) as misplaced:
        admin.start_reindex("placement", tenant="tenant-a")
    assert misplaced.value.detail == "tenant applies to target import only, not placement"
    with pytest.raises(braid.BadRequest) as untargeted:
        admin.start_reindex("import")
    assert untargeted.value.detail == "target import needs `tenant`: the tenant about to be bulk loaded"
    with pytest.raises(braid.NotFound) as unknown:
        admin.reindex_job("no-such-job")
    assert unknown.value.detail == "no reindex job 'no-such-job'"

    stats = admin.stats(tenant="tenant-a")
    assert isinstance(stats, braid.Stats)
    assert [t.tenant for t in stats.tenants] == ["tenant-a"]
    assert stats.tenants[0].memories >= 3 and stats.totals.memories == stats.tenants[0].memories

    reloaded = admin.reload_config()
    assert isinstance(reloaded, braid.Reloaded)
    assert reloaded.reloaded and reloaded.restart_required == [] and reloaded.path.endswith("braid.yaml")

    health = client.health()
    assert isinstance(health, braid.Health) and health.ok
    assert health.backends["pgvector"]["status"] == "up"
    assert health.bookkeeping is not None and health.cache is not None
    assert health.extraction is not None and health.extraction.extractor == "spacy"
    assert health.extraction.memories >= 3 and health.extraction.failed == 0


def test_the_client_has_a_call_for_every_route_of_the_service(client: braid.Client) -> None:
    """Each (method, path) of the OpenAPI schema is one the client calls."""
    paths = client.openapi()["paths"]
    # /metrics (Prometheus' text exposition, when served) is for scrapers, not this client.
    served = {(method.upper(), path) for path, ops in paths.items() for method in ops if path != "/metrics"}
    called = {
        (c.method, c.path.replace("%7Bid%7D", "{id}"))
        for c in (
            _calls.remember([]),
            _calls.memory("{id}"),
            _calls.versions("k", None),
            _calls.delete_memory("{id}", False),
            _calls.write_graph([], []),
            _calls.delete_relations("a", "b", None),
            _calls.delete_entity("{id}"),
            _calls.recall("", {}),
            _calls.start_reindex("all", None),
            _calls.reindex_job("{id}"),
            _calls.reload_config(),
            _calls.stats(None),
            _calls.health(),
        )
    }
    normalised = {
        (m, p.replace("{memory_id}", "{id}").replace("{name}", "{id}").replace("{job_id}", "{id}")) for m, p in served
    }
    assert normalised == called


# --- errors -------------------------------------------------------------------


def test_errors_carry_the_status_and_the_services_message(server: Live, client: braid.Client) -> None:
    with pytest.raises(braid.BadRequest) as bad:
        client.remember(" ")
    assert bad.value.status == 400
    assert bad.value.detail == "memories[0].content must not be empty"
    assert bad.value.body == {"status_code": 400, "detail": "memories[0].content must not be empty"}
    assert (bad.value.method, bad.value.path) == ("POST", "/v1/memories")
    assert str(bad.value) == "400 memories[0].content must not be empty"

    with pytest.raises(braid.BadRequest) as strategy:
        client.recall("", strategy="semantic")
    assert (
        strategy.value.detail
        == "query must not be empty with strategy 'semantic' (strategies 'auto' and 'recent' take none)"
    )

    with braid.Client(server.url, "not-a-key-0123456789") as stranger, pytest.raises(braid.Unauthorized) as who:
        stranger.recall("anything")
    assert (who.value.status, who.value.detail) == (401, "invalid API key")

    with braid.Client(server.url, AGENT_B) as other, pytest.raises(braid.Forbidden) as forbidden:
        other.stats()
    assert (forbidden.value.status, forbidden.value.detail) == (403, "this endpoint needs an admin key")

    with pytest.raises(braid.NotFound) as missing:
        client.memory("no-such-memory")
    assert (missing.value.status, missing.value.detail) == (404, "no memory 'no-such-memory'")
    assert isinstance(missing.value, braid.HTTPError) and isinstance(missing.value, braid.BraidError)

    # Tenants are the key's: tenant-b does not see tenant-a's memory.
    mid = client.remember("A memory of tenant a only").ids[0]
    with braid.Client(server.url, AGENT_B) as other, pytest.raises(braid.NotFound):
        other.memory(mid)


def test_a_body_over_the_limit_is_payload_too_large(client: braid.Client) -> None:
    huge = [braid.Memory(content="x" * 30_000) for _ in range(150)]  # ~4.5 MB > 4 MiB
    with pytest.raises(braid.PayloadTooLarge) as too_large:
        client.remember(huge)
    assert too_large.value.status == 413


# --- retries and timeouts ------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[type[braid.BraidError], int, float]] = []
        self.errors: list[braid.BraidError] = []

    def __call__(self, error: braid.BraidError, attempt: int, wait: float) -> None:
        self.calls.append((type(error), attempt, wait))
        self.errors.append(error)


def test_a_real_429_is_retried_after_retry_after(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any
) -> None:
    # One request, then one every 4 s: the second of two requests sent back to
    # back is refused unless the first took 4 s.
    cfg = patient(conftest.test_config("x"))
    cfg = msgspec.structs.replace(cfg, limits=msgspec.structs.replace(cfg.limits, rate_per_second=0.25, rate_burst=1))
    app, dsn, alias = make_app(postgres, typesense, embedder, cfg)
    with live(app, dsn, alias) as srv:
        seen = Recorder()
        with braid.Client(srv.url, AGENT_A, on_retry=seen) as c:
            c.remember("Rate limited memory")  # the burst's one request
            answer = c.recall("rate limited")  # 429 with Retry-After, then answered
        assert [i.content for i in answer.items] == ["Rate limited memory"]
        assert [(kind, attempt) for kind, attempt, _ in seen.calls] == [(braid.RateLimited, 1)]
        (limited,) = seen.errors
        assert isinstance(limited, braid.RateLimited) and limited.retry_after in (1.0, 2.0, 3.0, 4.0)
        assert limited.retry_after <= seen.calls[0][2] <= limited.retry_after * 1.1  # plus at most 10% spread
        assert limited.detail == (
            "rate limit: this key may send 0.25 requests a second (bursts of 1); retry after the time in Retry-After"
        )

        # Without retries the 429 surfaces.
        with braid.Client(srv.url, AGENT_A, retry=braid.Retry(attempts=1)) as c:
            c.health()  # no key needed, no token taken
            with pytest.raises(braid.RateLimited) as refused:
                for _ in range(3):
                    c.recall("again")
        assert refused.value.status == 429 and refused.value.retry_after is not None


class FaultTransport(httpx.BaseTransport):
    """The real transport, except that the first ``count`` requests matching
    ``method`` are answered 503 with ``headers`` (a fault, not a fake)."""

    def __init__(self, method: str, count: int, headers: dict[str, str]) -> None:
        self.real = httpx.HTTPTransport()
        self.method, self.count, self.headers = method, count, headers
        self.sent: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(f"{request.method} {request.url.path}")
        if request.method == self.method and self.count > 0:
            self.count -= 1
            body = {"status_code": 503, "detail": "postgres unavailable (injected); retry later"}
            return httpx.Response(503, headers=self.headers, json=body)
        return self.real.handle_request(request)

    def close(self) -> None:
        self.real.close()


def test_a_503_with_an_http_date_retry_after_is_honoured(server: Live) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    headers = {
        "Date": format_datetime(now, usegmt=True),
        "Retry-After": format_datetime(now + timedelta(seconds=2), usegmt=True),
    }
    fault = FaultTransport("POST", 1, headers)
    seen = Recorder()
    with braid.Client(server.url, AGENT_A, transport=fault, on_retry=seen) as c:
        written = c.remember(braid.Memory(content="Written after a 503", id="after-503"))
    assert written.ids == ["after-503"]
    assert fault.sent == ["POST /v1/memories", "POST /v1/memories"]
    assert len(seen.calls) == 1 and seen.calls[0][0] is braid.Unavailable
    assert 2.0 <= seen.calls[0][2] <= 2.2  # read against the answer's own Date


def test_a_503_on_a_delete_is_not_retried(server: Live) -> None:
    fault = FaultTransport("DELETE", 5, {"Retry-After": "1"})
    with braid.Client(server.url, AGENT_A, transport=fault) as c, pytest.raises(braid.Unavailable) as unavailable:
        c.delete_memory("after-503")
    assert fault.sent == ["DELETE /v1/memories/after-503"]
    assert unavailable.value.retry_after == 1.0
    assert unavailable.value.detail == "postgres unavailable (injected); retry later"


def test_retries_stop_at_the_attempts_given(server: Live) -> None:
    fault = FaultTransport("POST", 10, {"Retry-After": "0"})
    seen = Recorder()
    with braid.Client(server.url, AGENT_A, transport=fault, on_retry=seen, retry=braid.Retry(attempts=3)) as c:
        with pytest.raises(braid.Unavailable):
            c.recall("anything")
    assert len(fault.sent) == 3
    assert [a for _, a, _ in seen.calls] == [1, 2]


class Stalled:
    """A TCP server that accepts connections and never answers; counts them."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()


@pytest.fixture
def stalled() -> Iterator[Stalled]:
    s = Stalled()
    yield s
    s.close()


def test_a_read_timeout_is_retried_for_a_recall_never_for_a_delete(stalled: Stalled) -> None:
    policy = braid.Retry(attempts=2, backoff_s=0.0)
    with braid.Client(stalled.url, AGENT_A, timeout=0.3, retry=policy) as c:
        with pytest.raises(braid.Timeout) as late:
            c.recall("anything")
        assert str(late.value) == "POST /v1/recall: no answer within 0.3 s"
        assert len(stalled.accepted) == 2
        with pytest.raises(braid.Timeout) as late_delete:
            c.delete_memory("m1")
        assert str(late_delete.value) == "DELETE /v1/memories/m1: no answer within 0.3 s"
        assert len(stalled.accepted) == 3


def test_a_connection_refused_is_a_connect_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with braid.Client(f"http://127.0.0.1:{port}", AGENT_A, retry=braid.Retry(attempts=2, backoff_s=0.0)) as c:
        with pytest.raises(braid.ConnectError) as refused:
            c.delete_memory("m1")  # nothing was sent: retried even for a delete
    assert str(refused.value).startswith("DELETE /v1/memories/m1: cannot connect: ")


def test_retry_after_is_read_as_seconds_or_an_http_date() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert braid.retry_after_seconds("3", now) == 3.0
    assert braid.retry_after_seconds(" 0.5 ", now) == 0.5
    assert braid.retry_after_seconds("-4", now) == 0.0
    assert braid.retry_after_seconds("Thu, 01 Jan 2026 12:00:07 GMT", now) == 7.0
    assert braid.retry_after_seconds("Thu, 01 Jan 2026 11:00:00 GMT", now) == 0.0
    assert braid.retry_after_seconds("soon", now) is None
    assert braid.retry_after_seconds(None, now) is None


def test_url_and_key_come_from_the_environment(monkeypatch: pytest.MonkeyPatch, server: Live) -> None:
    monkeypatch.setenv("BRAID_URL", server.url + "/")
    monkeypatch.setenv("BRAID_API_KEY", AGENT_A)
    with braid.Client() as c:
        assert c.url == server.url
        assert c.remember("From the environment").ids


# --- async --------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_async_client_covers_the_same_calls(server: Live) -> None:
    async with braid.AsyncClient(server.url, AGENT_A) as c, braid.AsyncClient(server.url, ADMIN_A) as admin:
        written = await c.remember(
            [
                braid.Memory(
                    content="Async Sam lives in Madrid",
                    id="async-v1",
                    mem_key="async.city",
                    created_at=T1,
                    session_id="async",
                ),
                braid.Memory(
                    content="Async Sam lives in Seville",
                    id="async-v2",
                    mem_key="async.city",
                    created_at=T2,
                    session_id="async",
                ),
            ]
        )
        assert written == braid.Written(ids=["async-v1", "async-v2"], superseded=["async-v1"])
        assert (await c.memory("async-v1")).superseded_by == "async-v2"
        assert [v.id for v in (await c.versions("async.city")).memories] == ["async-v2", "async-v1"]
        answer = await c.recall("where does async Sam live", top_k=3, sources=["pgvector"], session_id="async")
        assert [i.id for i in answer.items] == ["async-v2"]  # its retired version is not returned
        assert answer.sources["typesense"].status == "skipped"

        assert await c.write_graph(
            [], [{"source": "Eve", "relation": "knows", "target": "Finn"}]
        ) == braid.GraphWritten(entities=2, relations=1)
        assert (await c.delete_relations("Eve", "Finn")).deleted == 1
        assert (await c.delete_entity("Finn")).relations == 0
        assert await c.delete_memory("async-v2", restore_previous=True) == braid.Deleted("async-v2", "async-v1")

        job = await admin.start_reindex("pgvector")
        states = [s async for s in admin.follow_reindex(job.job_id, poll_s=0.05)]
        assert states[-1].status == "done"
        assert (await admin.wait_reindex(job.job_id)).status == "done"
        assert (await admin.reindex_job(job.job_id)).target == "pgvector"
        assert (await admin.stats()).totals.memories >= 2
        assert (await admin.reload_config()).reloaded
        assert (await c.health()).ok
        assert "/v1/recall" in (await c.openapi())["paths"]

        with pytest.raises(braid.NotFound) as missing:
            await c.memory("no-such-memory")
        assert missing.value.detail == "no memory 'no-such-memory'"
        with pytest.raises(braid.BadRequest) as bad:
            await c.recall("x", top_k=0)
        assert bad.value.status == 400 and "top_k" in bad.value.detail


class AsyncFaultTransport(httpx.AsyncBaseTransport):
    def __init__(self, count: int) -> None:
        self.real = httpx.AsyncHTTPTransport()
        self.count = count
        self.sent = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent += 1
        if self.count > 0:
            self.count -= 1
            return httpx.Response(429, headers={"Retry-After": "1"}, json={"status_code": 429, "detail": "slow down"})
        return await self.real.handle_async_request(request)

    async def aclose(self) -> None:
        await self.real.aclose()


@pytest.mark.anyio
async def test_the_async_client_honours_retry_after(server: Live) -> None:
    fault = AsyncFaultTransport(1)
    seen = Recorder()
    async with braid.AsyncClient(server.url, AGENT_A, transport=fault, on_retry=seen) as c:
        assert (await c.health()).ok
    assert fault.sent == 2
    assert len(seen.calls) == 1 and seen.calls[0][0] is braid.RateLimited and seen.calls[0][2] >= 1.0


def test_the_package_exports_what_it_says(tmp_path: Path) -> None:
    for name in braid.__all__:
        assert hasattr(braid, name), name


def test_waiting_for_a_job_that_failed_or_never_ends(server: Live, admin: braid.Client) -> None:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO reindex_jobs (id, target, status, error, finished_at) VALUES"
            " ('failed-x', 'typesense', 'failed', 'typesense unreachable', clock_timestamp()),"
            " ('stuck-x', 'pgvector', 'running', NULL, NULL)"
        )
    with pytest.raises(braid.ReindexFailed) as failed:
        admin.wait_reindex("failed-x")
    assert str(failed.value) == "reindex job failed-x failed: typesense unreachable"
    assert failed.value.job.status == "failed"
    with pytest.raises(braid.WaitTimeout) as stuck:
        admin.wait_reindex("stuck-x", poll_s=0.05, timeout_s=0.2)
    assert str(stuck.value) == "reindex job stuck-x still running after 0.2 s"
