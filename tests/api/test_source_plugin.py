"""A fourth source, registered in this test only: fused, reported and
configurable with no other file touched."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from config import SourceConfig
from indexers.base import Hit, SearchQuery
from indexers.registry import SourceDeps, SourceSpec, register, unregister

from .conftest import FileConfigured

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 1, 15, tzinfo=UTC)


class EchoSource:
    """Answers every query with one fixed memory."""

    name = "echo"
    needs_vector = False

    def __init__(self, deps: SourceDeps) -> None:
        self.searched: list[SearchQuery] = []

    async def search(self, query: SearchQuery) -> list[Hit]:
        self.searched.append(query)
        return [
            Hit(
                id="echo-1",
                content=f"You asked: {query.text}",
                kind="echo",
                tier="session",
                created_at=T0,
                confidence=0.9,
                score=1.0,
            )
        ]

    async def aclose(self) -> None:
        pass


@pytest.fixture
def echo() -> Iterator[None]:
    register(SourceSpec(name="echo", build=EchoSource, defaults=SourceConfig(weight=2.0), store="none"))
    yield
    unregister("echo")


async def test_a_registered_source_is_fused_reported_and_configured(echo: None, configured: FileConfigured) -> None:
    braid, client = configured.braid, configured.braid.client
    await braid.remember({"content": "The quarterly report is due Friday", "id": "q1"})
    await braid.synced()

    result = await braid.recall("quarterly report")
    assert list(result["sources"]) == ["typesense", "pgvector", "graph", "echo"]
    assert result["sources"]["echo"]["status"] == "ok"
    items = {i["id"]: i for i in result["items"]}
    assert items["echo-1"]["ranks"]["echo"] == 1
    assert items["echo-1"]["contributions"] == {"echo": pytest.approx(2.0 / 61)}
    assert items["q1"]["ranks"]["echo"] is None
    health = (await client.get("/health")).json()
    assert health["backends"]["echo"] == {"status": "up", "store": "none"}

    # Its section is configurable like any other: weight, deadline, enabled.
    configured.write("sources:\n  echo:\n    weight: 0.5\n")
    r = await configured.reload()
    assert r.status_code == 200, r.text
    result = await braid.recall("quarterly report")
    items = {i["id"]: i for i in result["items"]}
    assert items["echo-1"]["contributions"] == {"echo": pytest.approx(0.5 / 61)}

    result = await braid.recall("quarterly report", sources=["echo"])
    assert [i["id"] for i in result["items"]] == ["echo-1"]
    assert result["sources"]["typesense"]["status"] == "skipped"

    configured.write("sources:\n  echo:\n    enabled: false\n")
    assert (await configured.reload()).status_code == 200
    result = await braid.recall("quarterly report")
    assert result["sources"]["echo"]["status"] == "skipped"
    assert "echo-1" not in {i["id"] for i in result["items"]}
