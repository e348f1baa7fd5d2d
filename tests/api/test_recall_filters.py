"""The recall filters ``metadata`` (jsonb containment) and ``min_importance``,
honoured inside every source: each source alone and the fused recall return
exactly the matching memories, and a 5%-selective filter still fills top_k."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from .conftest import AGENT_B, Braid

pytestmark = pytest.mark.anyio

SOURCES: list[list[str] | None] = [["typesense"], ["pgvector"], ["graph"], None]
QUERY = "Project Zeta status update"
START = datetime(2026, 1, 1, tzinfo=UTC)


def zeta(i: int) -> dict[str, Any]:
    """Memory ``i`` of 200 about Project Zeta: every 20th is team red and
    urgent; every 20th (offset 5) has importance exactly 0.7, the next one 0.69."""
    importance = {5: 0.7, 6: 0.69}.get(i % 20, None if i % 2 else 0.2)
    return {
        "id": f"z{i:03d}",
        "content": f"Project Zeta status update {i}: milestone {i % 7} reviewed",
        "entities": ["Project Zeta"],
        "created_at": (START + timedelta(minutes=i)).isoformat(),
        "importance": importance,
        "metadata": {
            "team": "red" if i % 20 == 0 else "blue",
            "project": {"name": "zeta", "phase": i % 3},
            "labels": ["weekly", "urgent"] if i % 20 == 0 else ["weekly"],
        },
    }


RED = {f"z{i:03d}" for i in range(0, 200, 20)}
IMPORTANT = {f"z{i:03d}" for i in range(5, 200, 20)}


@pytest.fixture
async def zeta_braid(braid: Braid) -> Braid:
    await braid.remember(*(zeta(i) for i in range(200)))
    # Tenant B's memories match every filter, with more importance: never A's answer.
    await braid.remember(
        *({**zeta(i), "importance": 0.9, "metadata": {"team": "red", "labels": ["urgent"]}} for i in range(20)),
        key=AGENT_B,
    )
    await braid.synced()
    return braid


@pytest.mark.parametrize("sources", SOURCES, ids=lambda s: "fused" if s is None else s[0])
@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({"metadata": {"team": "red"}}, RED),
        ({"metadata": {"labels": ["urgent"]}}, RED),
        ({"metadata": {"project": {"name": "zeta"}, "labels": ["weekly", "urgent"]}}, RED),
        ({"min_importance": 0.7}, IMPORTANT),
        ({"min_importance": 0.7, "metadata": {"team": "blue"}}, IMPORTANT),
        ({"min_importance": 0.7, "metadata": {"team": "red"}}, set()),
    ],
    ids=["key", "array", "nested", "importance", "both", "none"],
)
async def test_a_selective_filter_fills_top_k_from_each_source(
    zeta_braid: Braid, sources: list[str] | None, filters: dict[str, Any], expected: set[str]
) -> None:
    """10 of 200 memories match (5%); top_k 10 gets all of them, and nothing else,
    from each source alone and fused (the graph reads only the 100 newest
    mentions of an entity: the filter applies inside that cap)."""
    body = {"top_k": 10, **filters, **({} if sources is None else {"sources": sources})}
    out = await zeta_braid.recall(QUERY, **body)
    assert out["degraded"] == []
    assert {i["id"] for i in out["items"]} == expected
    if sources is not None:
        assert out["sources"][sources[0]]["hits"] == len(expected)


#: Documents and filters whose containment Postgres decides (the oracle).
DOCUMENTS = [
    {"a": 1, "b": "x"},
    {"a": 1.0, "tags": [1, 2, 3]},
    {"a": "1", "nested": {"k": {"v": True}}},
    {"a": [1, 2], "nested": {"k": {"v": False, "w": None}}},
    {"a": {"b": 1}, "tags": [3]},
    {"a": [{"b": 1}, {"c": 2}], "odd`key, x=y": "back`tick"},
    {},
]
FILTERS = [
    {"a": 1},
    {"a": "1"},
    {"a": []},
    {"a": {}},
    {"tags": [3]},
    {"tags": [1, 3], "a": 1e0},
    {"nested": {"k": {"v": False}}},
    {"nested": {"k": {}}},
    {"odd`key, x=y": "back`tick"},
    {"a": None},
]


async def test_each_source_matches_metadata_as_postgres_containment(braid: Braid) -> None:
    ids = await braid.remember(
        *({"id": f"d{i}", "content": f"Harbour inspection note {i}", "metadata": m} for i, m in enumerate(DOCUMENTS))
    )
    await braid.synced()
    with psycopg.connect(braid.dsn) as conn:
        oracle = [
            {
                row[0]
                for row in conn.execute(
                    "SELECT id FROM memories WHERE tenant = 'tenant-a' AND metadata @> %s", (Jsonb(f),)
                ).fetchall()
            }
            for f in FILTERS
        ]
    assert oracle[0] == {"d0", "d1"} and set(ids) == {f"d{i}" for i in range(len(DOCUMENTS))}
    for wanted, expected in zip(FILTERS, oracle, strict=True):
        for sources in (["typesense"], ["pgvector"]):
            out = await braid.recall("Harbour inspection note", sources=sources, metadata=wanted, top_k=20)
            assert {i["id"] for i in out["items"]} == expected, (sources, wanted)


async def test_a_memory_without_importance_never_matches_min_importance(braid: Braid) -> None:
    await braid.remember(
        {"id": "none", "content": "Lighthouse lamp replaced"},
        {"id": "zero", "content": "Lighthouse lamp cleaned", "importance": 0.0},
    )
    await braid.synced()
    for sources in (["typesense"], ["pgvector"], None):
        body = {} if sources is None else {"sources": sources}
        out = await braid.recall("Lighthouse lamp", min_importance=0.0, **body)
        assert [i["id"] for i in out["items"]] == ["zero"]


async def test_filters_never_show_another_tenants_memories(zeta_braid: Braid) -> None:
    out = await zeta_braid.recall(QUERY, key=AGENT_B, top_k=50, min_importance=0.8, metadata={"team": "red"})
    assert {i["id"] for i in out["items"]} == {f"z{i:03d}" for i in range(20)}
    assert all(i["importance"] == pytest.approx(0.9) for i in out["items"])


async def test_a_typesense_reindex_keeps_metadata_filtering(braid: Braid) -> None:
    """The rebuilt collection's documents carry their metadata tokens too
    (reindex reads every stored field, metadata included)."""
    from .test_admin import reindex_typesense

    await braid.remember(
        *({"id": f"d{i}", "content": f"Harbour inspection note {i}", "metadata": m} for i, m in enumerate(DOCUMENTS))
    )
    await braid.synced()
    await reindex_typesense(braid)
    out = await braid.recall("Harbour inspection note", sources=["typesense"], metadata={"tags": [3]})
    assert {i["id"] for i in out["items"]} == {"d1", "d4"}
