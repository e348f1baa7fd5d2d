"""The recall result cache (``cache.ttlMs``): an identical recall is served
from it (``cached: true``), never past the tenant's last acknowledged write,
delete or graph edit, made through this service process or another one on
the same database, nor past the expiry of a memory it holds."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from config import CacheConfig
from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense
from indexers.base import Filters
from indexers.cache import cache_key
from indexers.results import RecallOptions
from tests.faults.service_proc import ServiceProcess

from . import conftest
from .conftest import AGENT_B, Braid, make_app, serve

pytestmark = pytest.mark.anyio


@pytest.fixture
async def cached(postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any) -> AsyncIterator[Braid]:
    cfg = msgspec.structs.replace(conftest.test_config("unused"), cache=CacheConfig(ttl_ms=60_000))
    # A degraded answer is never cached: deadlines a loaded machine cannot miss,
    # so that "served from the cache" depends on writes only.
    cfg = conftest.patient(cfg)
    app, dsn, alias = make_app(postgres, typesense, embedder, cfg)
    async with serve(app) as client:
        yield Braid(client=client, app=app, dsn=dsn, alias=alias)


def test_key_is_canonical() -> None:
    a = RecallOptions(query="q", filters=Filters(metadata={"a": 1, "b": [1, 2]}))
    b = RecallOptions(query="q", filters=Filters(metadata={"b": [1, 2], "a": 1}))
    assert cache_key("t", a) == cache_key("t", b)
    assert cache_key("t", a) == cache_key("t", msgspec.structs.replace(a, track=False))
    assert cache_key("t", a) != cache_key("u", a)
    assert cache_key("t", a) != cache_key("t", msgspec.structs.replace(a, top_k=3))


async def test_repeat_is_cached_until_a_write(cached: Braid) -> None:
    braid = cached
    await braid.remember({"content": "The heron nests by the lake", "entities": ["heron"]})
    await braid.synced()
    first = await braid.recall("heron lake")
    assert first["cached"] is False
    again = await braid.recall("heron lake")
    assert again["cached"] is True
    assert again["items"] == first["items"] and again["block"] == first["block"]
    # Same body, other tenant: not its answer.
    assert (await braid.recall("heron lake", key=AGENT_B))["cached"] is False

    new = (await braid.remember({"content": "The heron left the lake in May"}))[0]
    after = await braid.recall("heron lake")
    assert after["cached"] is False
    assert new in {i["id"] for i in after["items"]}
    await braid.synced()
    await braid.recall("heron lake")
    assert (await braid.recall("heron lake"))["cached"] is True

    r = await braid.client.delete(f"/v1/memories/{new}", headers=braid.headers(conftest.AGENT_A))
    assert r.status_code == 200
    assert (await braid.recall("heron lake"))["cached"] is False
    # (Typesense drops the memory once the outbox delivers the delete.)
    await braid.synced()
    gone = await braid.recall("heron lake")
    assert gone["cached"] is False and new not in {i["id"] for i in gone["items"]}
    await braid.post("/v1/graph", {"relations": [{"source": "heron", "relation": "eats", "target": "fish"}]})
    assert (await braid.recall("heron lake"))["cached"] is False

    stats = (await braid.client.get("/health")).json()["cache"]
    assert stats["hits"] == 2 and stats["entries"] >= 1


async def test_a_hit_still_records_use(cached: Braid) -> None:
    braid = cached
    await braid.remember({"id": "m1", "content": "Ibis feathers are white"})
    await braid.synced()
    await braid.recall("ibis feathers", track=False)
    queued = braid.runtime.bookkeeper.stats()
    hit = await braid.recall("ibis feathers")  # track defaults to true; same key as track false
    assert hit["cached"] is True
    after = braid.runtime.bookkeeper.stats()
    assert after.queued + after.written == queued.queued + queued.written + 1
    assert (await braid.recall("ibis feathers", track=False))["cached"] is True
    again = braid.runtime.bookkeeper.stats()
    assert again.queued + again.written == after.queued + after.written


async def test_an_answer_ends_when_a_memory_in_it_expires(cached: Braid) -> None:
    braid = cached
    await braid.remember({"id": "brief", "content": "The kestrel hovers", "ttl_seconds": 2})
    await braid.synced()
    assert "brief" in {i["id"] for i in (await braid.recall("kestrel"))["items"]}
    assert (await braid.recall("kestrel"))["cached"] is True
    await anyio.sleep(2.1)
    late = await braid.recall("kestrel")
    assert late["cached"] is False and late["items"] == []


async def test_a_supersession_and_a_restore_end_a_cached_answer(cached: Braid) -> None:
    """A write retiring a key's current memory (and a delete restoring it)
    bumps the tenant's generation: the cached answer naming the old version
    is never served after it."""
    braid = cached

    def version(mid: str, city: str, day: int) -> dict[str, Any]:
        return {
            "id": mid,
            "content": f"Sam lives in {city}",
            "entities": ["Sam"],
            "mem_key": "user.home_city",
            "created_at": f"2026-0{day}-01T09:00:00Z",
        }

    async def recall() -> tuple[bool, set[str]]:
        out = await braid.recall("Where does Sam live")
        assert out["degraded"] == [], out["sources"]
        return out["cached"], {i["id"] for i in out["items"]}

    await braid.remember(version("v1", "Lisbon", 3))
    await braid.synced()
    assert await recall() == (False, {"v1"})
    assert await recall() == (True, {"v1"})

    r = await braid.post("/v1/memories", {"memories": [version("v2", "Porto", 6)]})
    assert r.status_code == 201 and r.json()["superseded"] == ["v1"], r.text
    # Not even before Typesense hears of it.
    assert await recall() == (False, {"v2"})
    await braid.synced()
    assert await recall() == (False, {"v2"})
    assert await recall() == (True, {"v2"})

    r = await braid.client.delete(
        "/v1/memories/v2", params={"restore_previous": "true"}, headers=braid.headers(conftest.AGENT_A)
    )
    assert r.json() == {"deleted": "v2", "restored": "v1"}
    assert await recall() == (False, {"v1"})
    await braid.synced()
    assert await recall() == (False, {"v1"})
    assert await recall() == (True, {"v1"})


@pytest.fixture
def replicas(postgres: EmbeddedPostgres, typesense: EmbeddedTypesense) -> Any:
    """Two ``python -m service`` processes on one database and one Typesense alias."""
    homes = [Path(tempfile.mkdtemp(prefix="braid-replica-")) for _ in range(2)]
    cache = "cache:\n  ttlMs: 60000\n"
    one = ServiceProcess(homes[0], postgres, typesense, extra_yaml=cache)
    two = ServiceProcess(homes[1], postgres, typesense, extra_yaml=cache)
    two.dsn, two.alias = one.dsn, one.alias
    two.config.write_text(one.config.read_text())
    try:
        one.start()
        one.wait_healthy()  # migrates and creates the collection first
        two.start()
        two.wait_healthy()
        yield one, two
    finally:
        one.stop()
        two.stop()
        for home in homes:
            shutil.rmtree(home, ignore_errors=True)


async def test_two_service_processes(replicas: tuple[ServiceProcess, ServiceProcess]) -> None:
    one, two = replicas
    auth = ServiceProcess.auth()
    body = {"query": "puffin colony", "top_k": 5}

    async def recall(svc: ServiceProcess) -> dict[str, Any]:
        async with svc.client() as c:
            r = await c.post("/v1/recall", json=body, headers=auth)
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    async def drained(svc: ServiceProcess) -> None:
        async with svc.client() as c:
            for _ in range(200):
                if (await c.get("/health")).json()["backends"]["sync"]["pending"] == 0:
                    return
                await anyio.sleep(0.05)
        raise AssertionError("outbox not drained")

    async with one.client() as c:
        r = await c.post("/v1/memories", json={"memories": [{"content": "A puffin colony on the cliff"}]}, headers=auth)
        assert r.status_code == 201
    await drained(one)
    assert (await recall(two))["cached"] is False
    assert (await recall(two))["cached"] is True

    async with one.client() as c:
        r = await c.post(
            "/v1/memories", json={"memories": [{"content": "The puffin colony moved north"}]}, headers=auth
        )
        assert r.status_code == 201
        new = r.json()["ids"][0]
    after = await recall(two)  # right after the write was acknowledged by the other process
    assert after["cached"] is False
    assert new in {i["id"] for i in after["items"]}

    await drained(one)
    first = await recall(two)
    again = await recall(two)
    assert again["cached"] is True and again["items"] == first["items"]
    assert new in {i["id"] for i in again["items"]}
