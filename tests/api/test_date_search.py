"""A query naming dates searches the memories of those days (``query.dateSearchDays``),
through the HTTP API against the real Postgres, Typesense and model.

"What did we settle on 5 March 2024?" shares no word with "We picked the blue
logo for the launch", said that day, and its vector is far from it: each
source's floor leaves it out. Within the named day every memory is a
candidate, so the search there lists it without floors, as ``dates``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import pytest

from config import BraidConfig
from indexers.base import Hit, SearchQuery
from indexers.engine import Engine

from . import conftest
from .conftest import Braid, make_app, patient, serve

pytestmark = pytest.mark.anyio

LOGO = {"id": "logo", "content": "We picked the blue logo for the launch", "created_at": "2024-03-05T10:00:00Z"}
MEMORIES = [
    LOGO,
    {"id": "lunch", "content": "Lunch was a tomato soup with bread", "created_at": "2024-03-05T12:30:00Z"},
    {"id": "settle", "content": "We did not settle on anything yet", "created_at": "2024-03-01T09:00:00Z"},
    {"id": "agreed", "content": "We agreed on the budget for the next quarter", "created_at": "2024-03-08T09:00:00Z"},
    {"id": "decide", "content": "What we decide on Friday goes in the minutes", "created_at": "2024-02-20T09:00:00Z"},
]
QUERY = "What did we settle on 5 March 2024?"


@asynccontextmanager
async def app_with(postgres: Any, typesense: Any, embedder: Any, *, days: int) -> AsyncIterator[Braid]:
    cfg: BraidConfig = conftest.test_config("unused")
    cfg = msgspec.structs.replace(cfg, query=msgspec.structs.replace(cfg.query, date_search_days=days))
    app, dsn, alias = make_app(postgres, typesense, embedder, patient(cfg))
    async with serve(app) as client:
        braid = Braid(client=client, app=app, dsn=dsn, alias=alias)
        await braid.remember(*MEMORIES)
        await braid.synced()
        yield braid


def ids(out: dict[str, Any]) -> list[str]:
    return [i["id"] for i in out["items"]]


def dated(out: dict[str, Any]) -> list[str]:
    """The ids the search within the named dates listed, in the answer's order."""
    return [i["id"] for i in out["items"] if i["ranks"].get("dates") is not None]


async def test_a_query_naming_a_day_finds_what_was_said_that_day(postgres: Any, typesense: Any, embedder: Any) -> None:
    async with app_with(postgres, typesense, embedder, days=0) as braid:
        without = await braid.recall(QUERY, top_k=5)
    assert "logo" not in ids(without)
    async with app_with(postgres, typesense, embedder, days=31) as braid:
        out = await braid.recall(QUERY, top_k=5)
        assert out["query"]["dates"] == [["2024-03-05", "2024-03-05"]]
        assert out["degraded"] == []
        # The day's two memories, and nothing from another day.
        assert set(dated(out)) == {"logo", "lunch"}
        logo = next(i for i in out["items"] if i["id"] == "logo")
        # Weighted as pgvector, and the day's memories get the time factor.
        rank = logo["ranks"]["dates"]
        assert logo["contributions"]["dates"] == pytest.approx(1.0 / (60 + rank))
        assert logo["factors"]["time"] == pytest.approx(1.6)
        # The other sources' lists are what they were: pgvector's floor still holds.
        assert logo["ranks"]["pgvector"] is None
        # A question about another day lists that day's memory only.
        other = await braid.recall("What happened on 8 March 2024?", top_k=5)
        assert dated(other) == ["agreed"]


async def test_the_request_filters_bound_the_days(postgres: Any, typesense: Any, embedder: Any) -> None:
    async with app_with(postgres, typesense, embedder, days=31) as braid:
        # The named day lies before created_after: no search within it, nothing of that day.
        out = await braid.recall(QUERY, top_k=5, created_after="2024-03-06T00:00:00Z")
        assert all("dates" not in i["ranks"] for i in out["items"])
        assert "logo" not in ids(out) and "lunch" not in ids(out)
        # A filter inside the day narrows the search there.
        out = await braid.recall(QUERY, top_k=5, created_before="2024-03-05T11:00:00Z")
        assert dated(out) == ["logo"]
        # A month names its days; a query without a date searches no day.
        month = await braid.recall("What did we settle on in March 2024?", top_k=5)
        assert set(dated(month)) == {"logo", "lunch", "settle", "agreed"}
        # Two dates: every day from the first to the last.
        both = await braid.recall("What did we settle between 1 March 2024 and 8 March 2024?", top_k=5)
        assert set(dated(both)) == {"settle", "logo", "lunch", "agreed"}
        plain = await braid.recall("What did we settle on?", top_k=5)
        assert all("dates" not in i["ranks"] for i in plain["items"])
        # A year is more days than dateSearchDays: the time factor alone, as before.
        year = await braid.recall("What did we settle on in 2024?", top_k=5)
        assert year["query"]["dates"] == [["2024-01-01", "2024-12-31"]]
        assert all("dates" not in i["ranks"] for i in year["items"])
        # Restricted to Typesense, the recall has no vector source to search the days with.
        keyword = await braid.recall(QUERY, top_k=5, sources=["typesense"])
        assert all("dates" not in i["ranks"] for i in keyword["items"])


async def test_a_failing_search_within_the_dates_leaves_the_recall_as_it_was(braid: Braid, caplog: Any) -> None:
    await braid.remember(*MEMORIES)
    await braid.synced()
    engine: Engine = braid.runtime.engine
    source = engine.sources["pgvector"]
    search = source.search

    async def fails_within_dates(query: SearchQuery) -> list[Hit]:
        if not query.floors:
            raise RuntimeError("refused by the test")
        return await search(query)

    source.search = fails_within_dates  # type: ignore[method-assign]
    out = await braid.recall(QUERY, top_k=5)
    assert out["degraded"] == []
    assert "logo" not in ids(out)
    assert all("dates" not in i["ranks"] for i in out["items"])
    line = "the search within the query's dates failed, this recall ranks without it: refused by the test"
    assert line in caplog.text
