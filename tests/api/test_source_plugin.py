"""A fourth source, registered in this test only: fused, reported and
configurable with no other file touched."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from config import SourceConfig, load_config
from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense
from indexers.base import Hit, SearchQuery
from indexers.registry import SourceDeps, SourceSpec, register, unregister

from .conftest import ADMIN_A, Braid, make_app, serve

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


async def test_a_registered_source_is_fused_reported_and_configured(
    echo: None, postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any, tmp_path: Path
) -> None:
    path = tmp_path / "braid.yaml"
    path.write_text("searchTopK: 10\n")
    app, dsn, alias = make_app(postgres, typesense, embedder, load_config(path), str(path))
    async with serve(app) as client:
        braid = Braid(client=client, app=app, dsn=dsn, alias=alias)
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
        path.write_text(f"typesense:\n  collection: {alias}\nsources:\n  echo:\n    weight: 0.5\n")
        r = await braid.post("/admin/config/reload", {}, key=ADMIN_A)
        assert r.status_code == 200, r.text
        result = await braid.recall("quarterly report")
        items = {i["id"]: i for i in result["items"]}
        assert items["echo-1"]["contributions"] == {"echo": pytest.approx(0.5 / 61)}

        result = await braid.recall("quarterly report", sources=["echo"])
        assert [i["id"] for i in result["items"]] == ["echo-1"]
        assert result["sources"]["typesense"]["status"] == "skipped"

        path.write_text(f"typesense:\n  collection: {alias}\nsources:\n  echo:\n    enabled: false\n")
        assert (await braid.post("/admin/config/reload", {}, key=ADMIN_A)).status_code == 200
        result = await braid.recall("quarterly report")
        assert result["sources"]["echo"]["status"] == "skipped"
        assert "echo-1" not in {i["id"] for i in result["items"]}
