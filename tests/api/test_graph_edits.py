"""Relations and entities can be deleted through the API, tenant by tenant, and a
relation Postgres holds but Python cannot read never degrades a recall."""

from __future__ import annotations

import logging
from urllib.parse import quote

import psycopg
import pytest

from .conftest import AGENT_A, AGENT_B, Braid

pytestmark = pytest.mark.anyio

GRAPH = {
    "relations": [
        {"source": "Alex", "relation": "prefers", "target": "TypeScript"},
        {"source": "Alex", "relation": "uses", "target": "TypeScript"},
        {"source": "Alex", "relation": "lives_in", "target": "Lisbon"},
    ]
}


async def facts(braid: Braid, query: str = "Alex", key: str = AGENT_A) -> list[str]:
    result = await braid.recall(query, key=key, sources=["graph"], top_k=20)
    assert result["degraded"] == []
    return sorted(i["content"] for i in result["items"] if i["kind"] == "fact")


async def delete(braid: Braid, path: str, key: str = AGENT_A) -> tuple[int, dict[str, object]]:
    r = await braid.client.delete(path, headers=braid.headers(key))
    return r.status_code, r.json()


async def test_delete_relations_by_name_or_all(braid: Braid) -> None:
    assert (await braid.post("/v1/graph", GRAPH)).status_code == 201
    assert (await braid.post("/v1/graph", GRAPH, key=AGENT_B)).status_code == 201
    assert await facts(braid) == ["Alex lives in Lisbon.", "Alex prefers TypeScript.", "Alex uses TypeScript."]

    # Names match as on write: case- and space-insensitively.
    status, body = await delete(braid, "/v1/graph/relations?source=alex&target=%20TypeScript&relation=prefers")
    assert (status, body) == (200, {"deleted": 1})
    assert await facts(braid) == ["Alex lives in Lisbon.", "Alex uses TypeScript."]
    status, body = await delete(braid, "/v1/graph/relations?source=Alex&target=TypeScript&relation=prefers")
    assert (status, body["detail"]) == (404, "no 'prefers' relation from 'Alex' to 'TypeScript'")

    status, body = await delete(braid, "/v1/graph/relations?source=Alex&target=Lisbon")
    assert (status, body) == (200, {"deleted": 1})
    assert await facts(braid) == ["Alex uses TypeScript."]
    # Tenant B's copy is untouched.
    assert len(await facts(braid, key=AGENT_B)) == 3


@pytest.mark.parametrize(
    ("query", "detail"),
    [
        ("source=Alex", "Missing required query parameter 'target' for path /v1/graph/relations?source=Alex"),
        ("source=Alex&target=", "target '' is not a valid name (1-200 characters, no NUL)"),
        ("source=A%00x&target=B", "source 'A\\x00x' is not a valid name (1-200 characters, no NUL)"),
        (
            "source=A&target=B&relation=" + "r" * 101,
            f"relation {'r' * 101!r} is not a valid relation name (1-100 characters, no NUL)",
        ),
    ],
)
async def test_delete_relations_refuses_bad_names(braid: Braid, query: str, detail: str) -> None:
    status, body = await delete(braid, f"/v1/graph/relations?{query}")
    assert status == 400
    assert body["detail"] == detail


async def test_delete_entity_takes_its_relations_and_mentions(braid: Braid) -> None:
    assert (await braid.post("/v1/graph", GRAPH)).status_code == 201
    await braid.remember({"content": "Alex moved to Lisbon last spring", "id": "m1", "entities": ["Alex"]})
    with psycopg.connect(braid.dsn) as conn:
        assert conn.execute("SELECT count(*) FROM mentions WHERE memory_id = 'm1'").fetchone() == (2,)

    status, body = await delete(braid, "/v1/graph/entities/lisbon")
    # The client's relation, and the two the memory's text states (extracted:
    # Alex move_to Lisbon, Alex mentioned_with Lisbon).
    assert (status, body) == (200, {"deleted": "lisbon", "relations": 3})
    assert await facts(braid) == ["Alex prefers TypeScript.", "Alex uses TypeScript."]
    with psycopg.connect(braid.dsn) as conn:
        # The memory stays, with its mention of Alex only.
        assert conn.execute("SELECT count(*) FROM memories WHERE id = 'm1'").fetchone() == (1,)
        assert conn.execute(
            "SELECT e.name FROM mentions mn JOIN entities e ON e.id = mn.entity_id WHERE mn.memory_id = 'm1'"
        ).fetchall() == [("Alex",)]

    status, body = await delete(braid, "/v1/graph/entities/Lisbon")
    assert (status, body["detail"]) == (404, "no entity 'Lisbon'")
    # Another tenant cannot delete tenant A's entity.
    status, _ = await delete(braid, "/v1/graph/entities/Alex", key=AGENT_B)
    assert status == 404
    assert len(await facts(braid)) == 2


async def test_delete_entity_with_a_slash_in_its_name(braid: Braid) -> None:
    graph = {"relations": [{"source": "Sam", "relation": "writes", "target": "C/C++"}]}
    assert (await braid.post("/v1/graph", graph)).status_code == 201
    status, body = await delete(braid, f"/v1/graph/entities/{quote('C/C++', safe='')}")
    assert (status, body) == (200, {"deleted": "C/C++", "relations": 1})


async def test_a_relation_python_cannot_read_is_skipped_and_logged_once(
    braid: Braid, caplog: pytest.LogCaptureFixture
) -> None:
    """A relation stored before its dates were checked (1 BC is valid in Postgres,
    not in Python) must not fail the graph read for the tenant."""
    assert (await braid.post("/v1/graph", GRAPH)).status_code == 201
    with psycopg.connect(braid.dsn, autocommit=True) as conn:
        conn.execute("UPDATE relations SET valid_from = '0001-12-31 23:30:00+00 BC' WHERE relation = 'lives_in'")
        (bad_id,) = conn.execute("SELECT id FROM relations WHERE relation = 'lives_in'").fetchone()
    caplog.set_level(logging.WARNING, logger="braid.graph")
    for _ in range(3):
        assert await facts(braid) == ["Alex prefers TypeScript.", "Alex uses TypeScript."]
    logged = [r.getMessage() for r in caplog.records if r.name == "braid.graph"]
    assert logged == [f"relation {bad_id} skipped: its time (-62135598600.0 s) is outside years 1-9999"]
    # And it can be deleted.
    status, body = await delete(braid, "/v1/graph/relations?source=Alex&target=Lisbon")
    assert (status, body) == (200, {"deleted": 1})
