"""Two keys of two tenants: neither ever sees the other's memories, through any source."""

from __future__ import annotations

import pytest

from .conftest import AGENT_A, AGENT_B, Braid

pytestmark = pytest.mark.anyio

SHARED_TEXTS = [
    "User drives a Honda Civic",
    "The password is Blue",
    "Alex prefers TypeScript for frontend work",
    "Meeting with the design team every Tuesday",
    "Allergic to peanuts",
]
QUERIES = [
    "what car does this person have",
    "password Blue",
    "What should I know about Alex?",
    "TypeScript",
    "allergies",
    "Tuesday meeting",
]


async def test_tenants_never_see_each_other(braid: Braid) -> None:
    owned: dict[str, set[str]] = {}
    for key, tag in ((AGENT_A, "a"), (AGENT_B, "b")):
        r = await braid.post(
            "/v1/graph",
            {
                "entities": [{"name": "Alex"}, {"name": "TypeScript"}],
                "relations": [{"source": "Alex", "relation": "prefers", "target": "TypeScript"}],
            },
            key,
        )
        assert r.status_code == 201
        # The same client-chosen ids in both tenants must stay two memories.
        ids = await braid.remember(
            *(
                {"id": f"m{i}", "content": f"{text} ({tag})", "entities": ["TypeScript", "Alex"]}
                for i, text in enumerate(SHARED_TEXTS)
            ),
            key=key,
        )
        owned[key] = {f"{tag}:{i}" for i in ids}
    await braid.synced()

    for key, tag, other in ((AGENT_A, "a", "b"), (AGENT_B, "b", "a")):
        for query in QUERIES:
            for sources in (["typesense"], ["pgvector"], ["graph"], None):
                fields = {"top_k": 50} | ({"sources": sources} if sources else {})
                out = await braid.recall(query, key=key, **fields)
                assert out["degraded"] == []
                for item in out["items"]:
                    assert f"({other})" not in item["content"], (query, sources, item)
                    if item["kind"] != "fact":
                        assert item["content"].endswith(f"({tag})")
                assert f"({other})" not in out["block"]
        # Every source returned something for this tenant: the check above is not vacuous.
        out = await braid.recall("Alex TypeScript", key=key, top_k=50)
        assert all(out["sources"][s]["hits"] > 0 for s in ("typesense", "pgvector", "graph"))


async def test_delete_is_scoped_to_the_tenant(braid: Braid) -> None:
    (mid,) = await braid.remember({"id": "same", "content": "tenant A's note"}, key=AGENT_A)
    await braid.remember({"id": "same", "content": "tenant B's note"}, key=AGENT_B)
    r = await braid.client.delete(f"/v1/memories/{mid}", headers=braid.headers(AGENT_B))
    assert r.status_code == 200
    await braid.synced()
    out = await braid.recall("note", key=AGENT_A)
    assert [i["content"] for i in out["items"]] == ["tenant A's note"]
    out = await braid.recall("note", key=AGENT_B)
    assert out["items"] == []
