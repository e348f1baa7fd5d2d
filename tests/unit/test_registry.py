"""The fan-out: each source under its own deadline; failures and stalls degrade, never fail."""

from __future__ import annotations

from datetime import UTC, datetime

import anyio
import msgspec
import pytest

from config import BraidConfig
from indexers.base import Hit, SearchQuery, SourceUnavailable
from indexers.registry import search_all

pytestmark = pytest.mark.anyio

HIT = Hit(
    id="m1",
    content="c",
    kind="note",
    tier="session",
    created_at=datetime(2026, 1, 1, tzinfo=UTC),
    confidence=1.0,
    score=1.0,
)


class Answers:
    name = "typesense"
    needs_vector = False

    async def search(self, query: SearchQuery) -> list[Hit]:
        return [HIT]

    async def aclose(self) -> None: ...


class Fails(Answers):
    async def search(self, query: SearchQuery) -> list[Hit]:
        raise SourceUnavailable("pgvector", "connection refused")


class Stalls(Answers):
    async def search(self, query: SearchQuery) -> list[Hit]:
        await anyio.sleep_forever()
        raise AssertionError


class Buggy(Answers):
    async def search(self, query: SearchQuery) -> list[Hit]:
        raise KeyError("oops")


def config(deadline_ms: int = 50) -> BraidConfig:
    cfg = BraidConfig()
    for name in ("typesense", "pgvector", "graph"):
        cfg = cfg.with_source(name, deadline_ms=deadline_ms)
    return cfg


QUERY = SearchQuery(tenant="t", text="q", vector=None, limit=10)


async def test_each_source_reports_its_own_outcome() -> None:
    sources = {"typesense": Answers(), "pgvector": Fails(), "graph": Stalls()}
    with anyio.fail_after(5):
        out = await search_all(sources, {n: QUERY for n in sources}, config())
    assert out["typesense"].status == "ok" and out["typesense"].hits == [HIT]
    assert out["pgvector"].status == "error"
    assert out["pgvector"].error == "pgvector unavailable: connection refused"
    assert out["graph"].status == "timeout"
    assert out["graph"].error == "no answer within 50 ms"
    assert out["graph"].hits == []


async def test_unexpected_exception_degrades_the_source_only() -> None:
    sources = {"typesense": Answers(), "graph": Buggy()}
    out = await search_all(sources, {n: QUERY for n in sources}, config())
    assert out["typesense"].status == "ok"
    assert out["graph"].status == "error"
    assert out["graph"].error == "KeyError: 'oops'"


async def test_source_without_query_is_skipped() -> None:
    sources = {"typesense": Answers(), "pgvector": Answers()}
    out = await search_all(sources, {"typesense": QUERY}, config())
    assert list(out) == ["typesense", "pgvector"]
    assert out["pgvector"].status == "skipped"


class VectorOnly(Answers):
    name = "pgvector"
    needs_vector = True

    def __init__(self) -> None:
        self.searched: list[SearchQuery] = []

    async def search(self, query: SearchQuery) -> list[Hit]:
        self.searched.append(query)
        return [HIT]


async def test_source_needing_a_vector_is_not_searched_without_one() -> None:
    vector_only = VectorOnly()
    sources = {"typesense": Answers(), "pgvector": vector_only}
    out = await search_all(sources, {n: QUERY for n in sources}, config())
    assert out["typesense"].status == "ok"
    assert out["pgvector"].status == "no_vector"
    assert out["pgvector"].error == "needs the query vector, and the recall has none"
    assert out["pgvector"].hits == [] and vector_only.searched == []


async def test_source_needing_a_vector_is_searched_with_one() -> None:
    vector_only = VectorOnly()
    query = msgspec.structs.replace(QUERY, vector=(1.0, 0.0))
    out = await search_all({"pgvector": vector_only}, {"pgvector": query}, config())
    assert out["pgvector"].status == "ok" and out["pgvector"].hits == [HIT]
    assert vector_only.searched == [query]


async def test_a_query_allowed_the_vector_only_needs_one() -> None:
    """A semantic recall lets a keyword-and-vector source match by vector only:
    without the vector it has nothing to search with."""
    semantic = msgspec.structs.replace(QUERY, matches=frozenset({"vector"}))
    out = await search_all({"typesense": Answers()}, {"typesense": semantic}, config())
    assert out["typesense"].status == "no_vector" and out["typesense"].hits == []
    keyword = msgspec.structs.replace(QUERY, matches=frozenset({"keyword"}))
    out = await search_all({"typesense": Answers()}, {"typesense": keyword}, config())
    assert out["typesense"].status == "ok"
