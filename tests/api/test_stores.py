"""Writes reach every store; deletes leave every store; upserts by id stay single."""

from __future__ import annotations

import pytest

from .conftest import AGENT_A, Braid

pytestmark = pytest.mark.anyio

ALL = ("typesense", "pgvector", "graph")


async def test_write_is_searchable_in_each_source(braid: Braid) -> None:
    await braid.post("/v1/graph", {"entities": [{"name": "Kestrel"}], "relations": []})
    (mid,) = await braid.remember({"content": "Kestrel is the codename of the billing rewrite"})
    await braid.synced()
    doc = await braid.runtime.index.fetch(mid, tenant="tenant-a")
    assert doc is not None and doc["content"].startswith("Kestrel")
    for source in ALL:
        out = await braid.recall("Kestrel codename", sources=[source])
        assert [i["id"] for i in out["items"]][:1] == [mid], source


async def test_delete_removes_from_every_store(braid: Braid) -> None:
    await braid.post("/v1/graph", {"entities": [{"name": "Kestrel"}]})
    (mid,) = await braid.remember({"content": "Kestrel ships in March", "entities": ["Kestrel"]})
    await braid.synced()
    r = await braid.client.delete(f"/v1/memories/{mid}", headers=braid.headers(AGENT_A))
    assert r.status_code == 200 and r.json() == {"deleted": mid}
    await braid.synced()
    assert await braid.runtime.index.fetch(mid, tenant="tenant-a") is None
    for source in ALL:
        out = await braid.recall("Kestrel ships", sources=[source])
        assert mid not in [i["id"] for i in out["items"]], source


async def test_upsert_by_id_is_idempotent(braid: Braid) -> None:
    await braid.remember({"id": "pref-1", "content": "Prefers tea"})
    await braid.remember({"id": "pref-1", "content": "Prefers coffee", "kind": "preference"})
    await braid.remember({"id": "pref-1", "content": "Prefers coffee", "kind": "preference"})
    await braid.synced()
    for source in ("typesense", "pgvector"):
        out = await braid.recall("what does the user prefer to drink", sources=[source])
        assert [(i["id"], i["content"], i["kind"]) for i in out["items"]] == [
            ("pref-1", "Prefers coffee", "preference")
        ], source
    assert await braid.runtime.index.count(tenant="tenant-a") == 1


async def test_min_confidence_drops_low_confidence_memories(braid: Braid) -> None:
    await braid.remember(
        {"content": "The office wifi password is hunter2", "confidence": 0.3},
        {"content": "The guest wifi password is welcome1", "confidence": 0.9},
    )
    await braid.synced()
    out = await braid.recall("wifi password")
    assert [i["content"] for i in out["items"]] == ["The guest wifi password is welcome1"]
    out = await braid.recall("wifi password", min_confidence=0.1)
    assert len(out["items"]) == 2


async def test_filters_apply_in_every_source(braid: Braid) -> None:
    await braid.remember(
        {"content": "Deploys happen on Thursdays", "session_id": "s1", "tags": ["ops"]},
        {"content": "Deploys are frozen in December", "session_id": "s2", "tags": ["policy"]},
        {"content": "Deploy checklist lives in the wiki", "tier": "rag", "kind": "doc"},
    )
    await braid.synced()
    for source in ("typesense", "pgvector"):
        out = await braid.recall("deploys", sources=[source], session_id="s1")
        assert [i["content"] for i in out["items"]] == ["Deploys happen on Thursdays"]
        out = await braid.recall("deploys", sources=[source], tags=["policy"])
        assert [i["content"] for i in out["items"]] == ["Deploys are frozen in December"]
        out = await braid.recall("deploys", sources=[source], tiers=["rag"])
        assert [i["content"] for i in out["items"]] == ["Deploy checklist lives in the wiki"]
        out = await braid.recall("deploys", sources=[source], kinds=["doc"])
        assert [i["tier"] for i in out["items"]] == ["rag"]


async def test_health_reports_every_backend_up(braid: Braid) -> None:
    r = await braid.client.get("/health")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok"
    for name in ALL:
        assert body["backends"][name]["status"] == "up"
