"""Supersession by ``mem_key``, versions and time travel (``as_of``), through
the HTTP API against the real Postgres and Typesense: a retired memory is
returned by no source (Typesense included, before and after the outbox told
it), the versions list shows every version, ``as_of`` answers as of then."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import psycopg
import pytest

from indexers.base import BackendError, Filters, MemoryRecord, SearchQuery
from indexers.typesense.documents import NEVER

from .conftest import AGENT_A, AGENT_B, Braid

pytestmark = pytest.mark.anyio

SOURCES: list[list[str] | None] = [["typesense"], ["pgvector"], ["graph"], None]
T1 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
T2 = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)
QUERY = "Where does Sam live"
KEY = "user.home_city"


def version(mid: str, city: str, at: datetime, **extra: Any) -> dict[str, Any]:
    return {
        "id": mid,
        "content": f"Sam lives in {city}",
        "entities": ["Sam"],
        "mem_key": KEY,
        "created_at": at.isoformat(),
        **extra,
    }


async def write(braid: Braid, *memories: dict[str, Any], key: str = "") -> dict[str, Any]:
    r = await braid.post("/v1/memories", {"memories": list(memories)}, *([key] if key else []))
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


async def ids(braid: Braid, sources: list[str] | None, **fields: Any) -> set[str]:
    body = {"top_k": 20, **fields, **({} if sources is None else {"sources": sources})}
    out = await braid.recall(QUERY, **body)
    assert out["degraded"] == [], out["sources"]
    return {i["id"] for i in out["items"]}


async def typesense_alone(braid: Braid, as_of: datetime | None = None) -> set[str]:
    """The Typesense source's own answer, without the engine's check against Postgres."""
    source = braid.runtime.engine.sources["typesense"]
    hits = await source.search(
        SearchQuery(tenant="tenant-a", text="Sam lives", vector=None, limit=20, filters=Filters(as_of=as_of))
    )
    return {h.id for h in hits}


@pytest.fixture
async def two_versions(braid: Braid) -> Braid:
    assert (await write(braid, version("v1", "Lisbon", T1)))["superseded"] == []
    assert await write(braid, version("v2", "Porto", T2)) == {"ids": ["v2"], "superseded": ["v1"]}
    await braid.synced()
    return braid


@pytest.mark.parametrize("sources", SOURCES, ids=lambda s: "fused" if s is None else s[0])
async def test_only_the_newest_version_is_recalled(two_versions: Braid, sources: list[str] | None) -> None:
    assert await ids(two_versions, sources) == {"v2"}


async def test_typesense_itself_filters_a_retired_memory(two_versions: Braid) -> None:
    """After the outbox ran, the Typesense documents carry the lifecycle: its
    own filter leaves v1 out (the engine's check is not what does it)."""
    assert await typesense_alone(two_versions) == {"v2"}
    doc = await two_versions.runtime.index.fetch("v1", tenant="tenant-a")
    assert doc is not None and doc["superseded_at"] == int(T2.timestamp()) * 1_000_000
    assert doc["mem_key"] == KEY
    current = await two_versions.runtime.index.fetch("v2", tenant="tenant-a")
    assert current is not None and current["superseded_at"] == NEVER


class Stalled:
    """A Typesense writer that refuses everything: the outbox stays pending."""

    async def upsert(self, records: Sequence[MemoryRecord], collections: Mapping[str, str] | None = None) -> None:
        raise BackendError("stalled for the test")

    async def delete(self, keys: Sequence[tuple[str, str]], collections: Mapping[str, str] | None = None) -> None:
        raise BackendError("stalled for the test")


async def test_a_retired_memory_is_not_recalled_before_typesense_learns_of_it(braid: Braid) -> None:
    await write(braid, version("v1", "Lisbon", T1))
    await braid.synced()
    sync = braid.runtime.sync
    writer, sync._index = sync._index, Stalled()
    try:
        await write(braid, version("v2", "Porto", T2))
        with anyio.fail_after(5):
            while sync.last_error is None:
                await anyio.sleep(0.01)
        assert await sync.pending() > 0
        # Typesense still holds v1 as current...
        assert await typesense_alone(braid) == {"v1"}
        # ...but no recall returns it.
        for sources in SOURCES:
            assert "v1" not in await ids(braid, sources), sources
        assert await ids(braid, ["pgvector"]) == {"v2"}
    finally:
        sync._index = writer
    await braid.synced(timeout=30)
    assert await typesense_alone(braid) == {"v2"}


@pytest.mark.parametrize("sources", SOURCES, ids=lambda s: "fused" if s is None else s[0])
async def test_as_of_between_the_versions_recalls_the_first(two_versions: Braid, sources: list[str] | None) -> None:
    between = (T1 + timedelta(days=1)).isoformat()
    assert await ids(two_versions, sources, as_of=between) == {"v1"}
    assert await ids(two_versions, sources, as_of=(T2 + timedelta(seconds=1)).isoformat()) == {"v2"}
    assert await ids(two_versions, sources, as_of=(T1 - timedelta(seconds=1)).isoformat()) == set()


async def test_typesense_filters_as_of_to_the_microsecond(two_versions: Braid) -> None:
    assert await typesense_alone(two_versions, as_of=T2 - timedelta(microseconds=1)) == {"v1"}
    assert await typesense_alone(two_versions, as_of=T2) == {"v2"}


async def test_as_of_sets_the_reference_time_of_the_recency_factor(two_versions: Braid) -> None:
    """Age is counted back from as_of: v1, a day old then, gets the recency
    factor a day-old memory gets; reference_time, when given, wins."""
    between = T1 + timedelta(days=1)
    out = await two_versions.recall(QUERY, as_of=between.isoformat(), sources=["pgvector"])
    ref = await two_versions.recall(
        QUERY, as_of=between.isoformat(), reference_time=between.isoformat(), sources=["pgvector"]
    )
    assert out["items"][0]["factors"] == ref["items"][0]["factors"]
    later = await two_versions.recall(
        QUERY, as_of=between.isoformat(), reference_time=(between + timedelta(days=300)).isoformat()
    )
    assert later["items"][0]["factors"].get("recency") != out["items"][0]["factors"].get("recency")


async def test_the_graph_walks_relations_valid_at_as_of(braid: Braid) -> None:
    r = await braid.post(
        "/v1/graph",
        {
            "relations": [
                {"source": "Sam", "relation": "works_at", "target": "Acme", "valid_to": T2.isoformat()},
                {"source": "Sam", "relation": "works_at", "target": "Globex", "valid_from": T2.isoformat()},
            ]
        },
    )
    assert r.status_code == 201, r.text

    async def facts(as_of: datetime | None) -> list[str]:
        fields = {} if as_of is None else {"as_of": as_of.isoformat()}
        out = await braid.recall("Where does Sam work", sources=["graph"], **fields)
        return [i["content"] for i in out["items"]]

    now = datetime.now(UTC)
    assert await facts(None) == ["Sam works at Globex."]
    assert await facts(T1) == []  # both written after T1
    assert await facts(now + timedelta(days=1)) == ["Sam works at Globex."]
    async with braid.runtime.store.pool.connection() as conn:
        await conn.execute("UPDATE relations SET created_at = %s", (T1 - timedelta(days=30),))
    assert await facts(T1) == ["Sam works at Acme."]


async def test_the_versions_list_shows_both_newest_first(two_versions: Braid) -> None:
    r = await two_versions.client.get("/v1/memories", params={"mem_key": KEY}, headers=two_versions.headers(AGENT_A))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["mem_key"] == KEY
    got = [(m["id"], m["content"], m["current"], m["superseded_by"], m["superseded_at"]) for m in body["memories"]]
    assert got == [
        ("v2", "Sam lives in Porto", True, None, None),
        ("v1", "Sam lives in Lisbon", False, "v2", "2026-06-01T09:00:00Z"),
    ]


async def test_get_one_memory_with_its_lifecycle(two_versions: Braid) -> None:
    r = await two_versions.client.get("/v1/memories/v1", headers=two_versions.headers(AGENT_A))
    assert r.status_code == 200, r.text
    m = r.json()
    assert {k: m[k] for k in ("id", "mem_key", "superseded_at", "superseded_by", "created_at", "current")} == {
        "id": "v1",
        "mem_key": KEY,
        "superseded_at": "2026-06-01T09:00:00Z",
        "superseded_by": "v2",
        "created_at": "2026-03-01T09:00:00Z",
        "current": False,
    }
    assert m["content"] == "Sam lives in Lisbon" and m["kind"] == "note" and m["model"] == "all-MiniLM-L6-v2"
    r = await two_versions.client.get("/v1/memories/nope", headers=two_versions.headers(AGENT_B))
    assert r.status_code == 404 and r.json()["detail"] == "no memory 'nope'"


async def test_fifty_concurrent_writers_leave_one_current_memory(braid: Braid) -> None:
    answers: list[dict[str, Any]] = []

    async def writer(n: int) -> None:
        r = await braid.post(
            "/v1/memories",
            {"memories": [{"id": f"w{n:02d}", "content": f"Sam's mood is number {n}", "mem_key": "user.mood"}]},
        )
        assert r.status_code == 201, r.text
        answers.append(r.json())

    async with anyio.create_task_group() as tg:
        for n in range(50):
            tg.start_soon(writer, n)
    await braid.synced(timeout=60)

    with psycopg.connect(braid.dsn) as conn:
        rows = conn.execute(
            "SELECT id, superseded_by FROM memories WHERE tenant = 'tenant-a' AND mem_key = 'user.mood'"
        ).fetchall()
    assert len(rows) == 50
    current = [mid for mid, by in rows if by is None]
    assert len(current) == 1
    # Each writer retired the one current before it: 49 retirements in all, each memory once.
    retired = [mid for a in answers for mid in a["superseded"]]
    assert sorted(retired) == sorted(mid for mid, by in rows if by is not None)

    docs = [await braid.runtime.index.fetch(f"w{n:02d}", tenant="tenant-a") for n in range(50)]
    assert all(d is not None for d in docs)
    in_typesense = [d["memory_id"] for d in docs if d is not None and d["superseded_at"] == NEVER]
    assert in_typesense == current


async def test_a_backfill_is_retired_at_insert(braid: Braid) -> None:
    await write(braid, version("v2", "Porto", T2))
    assert await write(braid, version("v1", "Lisbon", T1)) == {"ids": ["v1"], "superseded": []}
    await braid.synced()
    for sources in SOURCES:
        assert await ids(braid, sources) == {"v2"}, sources
    r = await braid.client.get("/v1/memories/v1", headers=braid.headers(AGENT_A))
    assert (r.json()["superseded_by"], r.json()["superseded_at"]) == ("v2", "2026-06-01T09:00:00Z")
    assert await ids(braid, None, as_of=(T1 + timedelta(days=1)).isoformat()) == {"v1"}


async def test_a_backfill_between_two_versions_takes_its_place_in_time(braid: Braid) -> None:
    t3 = T2 + timedelta(days=90)
    await write(braid, version("v1", "Lisbon", T1))
    await write(braid, version("v3", "Faro", t3))
    assert await write(braid, version("v2", "Porto", T2)) == {"ids": ["v2"], "superseded": []}
    await braid.synced()
    chain = await versions(braid)
    assert [(m["id"], m["superseded_by"]) for m in chain] == [("v3", None), ("v2", "v3"), ("v1", "v2")]
    for sources in SOURCES:
        assert await ids(braid, sources, as_of=(T2 + timedelta(days=1)).isoformat()) == {"v2"}, sources
        assert await ids(braid, sources, as_of=(T1 + timedelta(days=1)).isoformat()) == {"v1"}, sources


async def versions(braid: Braid) -> list[dict[str, Any]]:
    r = await braid.client.get("/v1/memories", params={"mem_key": KEY}, headers=braid.headers(AGENT_A))
    assert r.status_code == 200, r.text
    return r.json()["memories"]  # type: ignore[no-any-return]


async def test_deleting_the_current_memory_resurrects_nothing(two_versions: Braid) -> None:
    r = await two_versions.client.delete("/v1/memories/v2", headers=two_versions.headers(AGENT_A))
    assert r.status_code == 200 and r.json() == {"deleted": "v2"}
    await two_versions.synced()
    for sources in SOURCES:
        assert await ids(two_versions, sources) == set(), sources
    assert [(m["id"], m["current"]) for m in await versions(two_versions)] == [("v1", False)]


async def test_restore_previous_makes_the_newest_retired_version_current(braid: Braid) -> None:
    await write(braid, version("v1", "Lisbon", T1))
    await write(braid, version("v2", "Porto", T2))
    await write(braid, version("v3", "Faro", T2 + timedelta(days=1)))
    await braid.synced()
    r = await braid.client.delete(
        "/v1/memories/v3",
        params={"restore_previous": "true"},
        headers=braid.headers(AGENT_A),
    )
    assert r.status_code == 200 and r.json() == {"deleted": "v3", "restored": "v2"}
    await braid.synced()
    for sources in SOURCES:
        assert await ids(braid, sources) == {"v2"}, sources
    assert await typesense_alone(braid) == {"v2"}
    chain = [(m["id"], m["current"], m["superseded_by"]) for m in await versions(braid)]
    assert chain == [("v2", True, None), ("v1", False, "v2")]


async def test_restore_previous_of_a_retired_memory_changes_nothing_else(two_versions: Braid) -> None:
    r = await two_versions.client.delete(
        "/v1/memories/v1", params={"restore_previous": "true"}, headers=two_versions.headers(AGENT_A)
    )
    assert r.status_code == 200 and r.json() == {"deleted": "v1"}
    assert [(m["id"], m["current"]) for m in await versions(two_versions)] == [("v2", True)]


async def test_a_typesense_reindex_keeps_the_lifecycle(two_versions: Braid) -> None:
    from .test_admin import reindex_typesense

    await reindex_typesense(two_versions)
    assert await typesense_alone(two_versions) == {"v2"}
    assert await typesense_alone(two_versions, as_of=T1 + timedelta(days=1)) == {"v1"}
    assert await ids(two_versions, ["typesense"]) == {"v2"}


async def test_memories_without_a_key_are_untouched(braid: Braid) -> None:
    await write(braid, {"id": "a", "content": "Sam lives in Lisbon"}, {"id": "b", "content": "Sam lives in Porto"})
    await braid.synced()
    for sources in (["typesense"], ["pgvector"]):
        assert await ids(braid, sources) == {"a", "b"}, sources


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ({"memories": [{"content": "x", "mem_key": ""}]}, "memories[0].mem_key"),
        ({"memories": [{"content": "x", "mem_key": "a\nb"}]}, "memories[0].mem_key"),
        ({"memories": [{"content": "x", "mem_key": "k" * 201}]}, "memories[0].mem_key"),
        ({"memories": [{"content": "x", "mem_key": 5}]}, "memories[0].mem_key"),
    ],
)
async def test_a_bad_mem_key_is_400_naming_the_field(braid: Braid, body: dict[str, Any], detail: str) -> None:
    r = await braid.post("/v1/memories", body)
    assert r.status_code == 400, r.text
    assert detail in r.json()["detail"]


async def test_a_blank_mem_key_is_400(braid: Braid) -> None:
    r = await braid.post("/v1/memories", {"memories": [{"content": "x"}, {"content": "y", "mem_key": "   "}]})
    assert r.status_code == 400
    assert r.json()["detail"] == (
        "memories[1].mem_key must not be blank (1-200 characters, not all spaces, no control characters)"
    )


@pytest.mark.parametrize(
    ("as_of", "detail"),
    [
        ("2026-13-01T00:00:00Z", "as_of"),
        ("2026-01-01T00:00:00", "as_of"),
        ("yesterday", "as_of"),
        ("0001-01-01T00:00:00+01:00", "as_of: 0001-01-01T00:00:00+01:00 is outside the years 1-9999"),
    ],
)
async def test_a_bad_as_of_is_400(braid: Braid, as_of: str, detail: str) -> None:
    r = await braid.post("/v1/recall", {"query": "x", "as_of": as_of})
    assert r.status_code == 400, r.text
    assert r.json()["detail"].startswith(detail), r.json()


@pytest.mark.parametrize(
    ("params", "detail"),
    [
        ({}, "mem_key is required: GET /v1/memories?mem_key=<key> lists that key's versions"),
        ({"mem_key": " "}, "mem_key must not be blank (1-200 characters, not all spaces, no control characters)"),
        (
            {"mem_key": "a\tb"},
            "mem_key 'a\\tb' is not a valid key (1-200 characters, not all spaces, no control characters)",
        ),
        ({"mem_key": "k", "limit": "0"}, "limit must be between 1 and 1000, got 0"),
    ],
)
async def test_a_bad_versions_query_is_400(braid: Braid, params: dict[str, str], detail: str) -> None:
    r = await braid.client.get("/v1/memories", params=params, headers=braid.headers(AGENT_A))
    assert r.status_code == 400, r.text
    assert r.json()["detail"] == detail, json.dumps(r.json())


async def test_recent_shows_current_memories_or_those_current_as_of(two_versions: Braid) -> None:
    out = await two_versions.recall("", strategy="recent")
    assert [i["id"] for i in out["items"]] == ["v2"]
    out = await two_versions.recall("", strategy="recent", as_of=(T1 + timedelta(days=1)).isoformat())
    assert [i["id"] for i in out["items"]] == ["v1"]


async def test_without_postgres_to_check_them_typesense_hits_with_a_key_are_left_out(
    two_versions: Braid, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check of Typesense's hits cannot reach Postgres (a fault injected):
    a hit with a mem_key might be retired and is left out; one without cannot
    be and stays."""
    await write(two_versions, {"id": "plain", "content": "Sam lives near the sea"})
    await two_versions.synced()

    async def unreachable(*_: Any) -> set[str]:
        raise psycopg.OperationalError("injected: postgres unreachable")

    assert await ids(two_versions, ["typesense"]) == {"v2", "plain"}
    monkeypatch.setattr(two_versions.runtime.store, "live", unreachable)
    assert await ids(two_versions, ["typesense"]) == {"plain"}


async def test_versions_in_one_write_are_taken_oldest_first(braid: Braid) -> None:
    await write(braid, version("v0", "Braga", T1 - timedelta(days=30)))
    out = await write(braid, version("v2", "Porto", T2), version("v1", "Lisbon", T1))
    assert out == {"ids": ["v2", "v1"], "superseded": ["v0", "v1"]}
    chain = [(m["id"], m["superseded_by"]) for m in await versions(braid)]
    assert chain == [("v2", None), ("v1", "v2"), ("v0", "v1")]
