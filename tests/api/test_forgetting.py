"""Forgetting through the HTTP API: ``expires_at`` / ``ttl_seconds``, a tier's
``retentionDays`` and the activation floor. Expired memories are never
returned by any source, and the sweeper removes exactly them from Postgres
and (through the outbox) from Typesense, Typesense outage or not."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import httpx
import msgspec
import psycopg
import pytest

from config import BraidConfig, LifecycleConfig
from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense

from . import conftest
from .conftest import AGENT_A, Braid, make_app, serve
from .test_outage import own_typesense  # noqa: F401  (a fixture)

pytestmark = pytest.mark.anyio

NOW = datetime.now(UTC)


def stamp(dt: datetime) -> str:
    return dt.isoformat().replace("+00:00", "Z")


def forgetting_config(alias: str, **lifecycle: Any) -> BraidConfig:
    """Session memories kept 30 days; no background sweep during the test."""
    cfg = conftest.test_config(alias)
    tiers = {**cfg.tiers, "session": msgspec.structs.replace(cfg.tiers["session"], retention_days=30.0)}
    return msgspec.structs.replace(
        cfg, tiers=tiers, lifecycle=LifecycleConfig(sweep_interval_s=3600.0, sweep_batch=2, **lifecycle)
    )


@pytest.fixture
async def forgetful(postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any) -> AsyncIterator[Braid]:
    app, dsn, alias = make_app(postgres, typesense, embedder, forgetting_config("unused"))
    async with serve(app) as client:
        yield Braid(client=client, app=app, dsn=dsn, alias=alias)


async def pg_ids(braid: Braid) -> set[str]:
    async with await psycopg.AsyncConnection.connect(braid.dsn, autocommit=True) as conn:
        cur = await conn.execute("SELECT id FROM memories")
        return {row[0] for row in await cur.fetchall()}


async def ts_ids(url: str, api_key: str, alias: str) -> set[str]:
    """The memory ids in the Typesense collection, read straight from Typesense."""
    async with httpx.AsyncClient(base_url=url, headers={"X-TYPESENSE-API-KEY": api_key}) as c:
        r = await c.get(f"/collections/{alias}/documents/search", params={"q": "*", "per_page": 250})
        r.raise_for_status()
        return {h["document"]["memory_id"] for h in r.json()["hits"]}


def mixed(marker: str) -> list[dict[str, Any]]:
    """One memory of each kind, all with ``marker`` in their text."""
    return [
        {"id": "past", "content": f"{marker} expired yesterday", "expires_at": stamp(NOW - timedelta(days=1))},
        {"id": "ttl", "content": f"{marker} lives one second", "ttl_seconds": 1},
        {"id": "future", "content": f"{marker} expires next year", "expires_at": stamp(NOW + timedelta(days=365))},
        {"id": "none", "content": f"{marker} never expires"},
        {"id": "old-kept", "content": f"{marker} twenty days old", "created_at": stamp(NOW - timedelta(days=20))},
        {"id": "old-gone", "content": f"{marker} forty days old", "created_at": stamp(NOW - timedelta(days=40))},
        # The retention is the session tier's: the rag tier keeps old memories.
        {"id": "old-rag", "content": f"{marker} forty days old rag", "tier": "rag",
         "created_at": stamp(NOW - timedelta(days=40))},
    ]  # fmt: skip


ALIVE = {"future", "none", "old-kept", "old-rag"}


async def returned(braid: Braid, query: str) -> dict[str, set[str]]:
    """The ids each source alone, the fused recall and ``recent`` return."""
    out = {}
    for name in ("typesense", "pgvector", "graph"):
        body = await braid.recall(query, sources=[name], top_k=50, min_confidence=0.0)
        assert body["degraded"] == [], body
        out[name] = {i["id"] for i in body["items"]}
    out["fused"] = {i["id"] for i in (await braid.recall(query, top_k=50))["items"]}
    out["recent"] = {i["id"] for i in (await braid.recall("", strategy="recent", top_k=50))["items"]}
    return out


async def test_expired_never_returned_and_sweep_removes_exactly_them(
    forgetful: Braid, typesense: EmbeddedTypesense
) -> None:
    braid = forgetful
    ids = await braid.remember(*mixed("Zanzibar"), {"content": "Zanzibar links", "entities": ["Zanzibar"]})
    assert ids[:7] == ["past", "ttl", "future", "none", "old-kept", "old-gone", "old-rag"]
    await braid.synced()
    await anyio.sleep(1.1)  # the ttl memory expires

    for where, got in (await returned(braid, "Zanzibar")).items():
        assert not got & {"past", "ttl", "old-gone"}, (where, got)
    # pgvector and recent reach every memory here; each live one is there.
    seen = await returned(braid, "Zanzibar")
    assert ALIVE <= seen["pgvector"] and ALIVE <= seen["recent"], seen
    item = next(i for i in (await braid.recall("Zanzibar next year", top_k=50))["items"] if i["id"] == "future")
    assert item["expires_at"].startswith(stamp(NOW + timedelta(days=365))[:10])

    # Nothing swept yet: every memory is still stored.
    assert len(await pg_ids(braid)) == 8
    removed = await braid.runtime.sweeper.sweep()  # batches of 2
    assert removed == 3
    assert await pg_ids(braid) == ALIVE | {ids[7]}
    assert await braid.runtime.sweeper.sweep() == 0
    await braid.synced()
    assert await ts_ids(typesense.url, typesense.api_key, braid.alias) == ALIVE | {ids[7]}

    health = (await braid.client.get("/health")).json()["lifecycle"]
    assert health["swept"] == 3 and health["last_swept"] == 0 and health["error"] is None
    assert health["last_run"] is not None


async def test_expiry_fields_are_checked(forgetful: Braid) -> None:
    r = await forgetful.post(
        "/v1/memories", {"memories": [{"content": "x", "ttl_seconds": 5, "expires_at": stamp(NOW)}]}, AGENT_A
    )
    assert r.status_code == 400
    assert r.json()["detail"] == "memories[0]: give expires_at or ttl_seconds, not both"
    r = await forgetful.post("/v1/memories", {"memories": [{"content": "x", "ttl_seconds": 0}]}, AGENT_A)
    assert r.status_code == 400
    r = await forgetful.post("/v1/memories", {"memories": [{"content": "x", "expires_at": "2030-01-01T00:00:00"}]})
    assert r.status_code == 400


async def test_a_rewrite_with_a_later_expiry_is_kept(forgetful: Braid) -> None:
    braid = forgetful
    await braid.remember({"id": "m", "content": "Quokka soon gone", "expires_at": stamp(NOW - timedelta(hours=1))})
    await braid.remember({"id": "m", "content": "Quokka stays", "expires_at": stamp(NOW + timedelta(hours=1))})
    assert await braid.runtime.sweeper.sweep() == 0
    assert await pg_ids(braid) == {"m"}
    await braid.remember({"id": "m", "content": "Quokka stays forever"})
    assert await braid.runtime.sweeper.sweep() == 0


async def test_activation_floor(postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any) -> None:
    """forgetBelow 0.4, half-life 1 day: importance x 2^(-age in days) must stay above 0.4."""
    cfg = forgetting_config("unused", forget_below=0.4, half_life_days=1.0)
    app, dsn, alias = make_app(postgres, typesense, embedder, cfg)
    async with serve(app) as client:
        braid = Braid(client=client, app=app, dsn=dsn, alias=alias)
        day = stamp(NOW - timedelta(days=1))
        await braid.remember(
            {"id": "keen", "content": "Wombat one day old, important", "importance": 1.0, "created_at": day},
            {"id": "fresh", "content": "Wombat new, no importance", "entities": ["Wombat"]},
            # 0.5 x 2^-2 = 0.125, and older than the sweep's horizon (ln 0.4 / -lambda = 1.32 days).
            {"id": "faded", "content": "Wombat two days old", "created_at": stamp(NOW - timedelta(days=2))},
            {"id": "minor", "content": "Wombat new, minor", "importance": 0.3},
            {"id": "null", "content": "Wombat new, worthless", "importance": 0.0},
        )
        await braid.synced()
        for where, got in (await returned(braid, "Wombat")).items():
            assert got == {"keen", "fresh"}, (where, got)
        # "minor" and "null" are younger than the floor's horizon (w <= 1): the
        # sweep's index range skips them until then; they are never returned meanwhile.
        assert await braid.runtime.sweeper.sweep() == 1
        assert await pg_ids(braid) == {"keen", "fresh", "minor", "null"}


async def test_typesense_outage_during_sweep(
    postgres: EmbeddedPostgres,
    own_typesense: EmbeddedTypesense,  # noqa: F811
    embedder: Any,
) -> None:
    app, dsn, alias = make_app(postgres, own_typesense, embedder, forgetting_config("unused"))
    async with serve(app) as client:
        braid = Braid(client=client, app=app, dsn=dsn, alias=alias)
        await braid.remember(*mixed("Okapi"))
        await braid.synced()
        await anyio.sleep(1.1)
        everything = {"past", "ttl", "future", "none", "old-kept", "old-gone", "old-rag"}
        assert await ts_ids(own_typesense.url, own_typesense.api_key, alias) == everything

        own_typesense.kill()
        assert await braid.runtime.sweeper.sweep() == 3
        assert await pg_ids(braid) == ALIVE
        assert await braid.runtime.sync.pending() == 3  # the deletes wait in the outbox
        body = await braid.recall("Okapi", top_k=50)
        assert body["degraded"] == ["typesense"]
        assert {i["id"] for i in body["items"]} <= ALIVE

        own_typesense.start()  # same data dir and port
        await braid.synced(timeout=30)
        assert await ts_ids(own_typesense.url, own_typesense.api_key, alias) == ALIVE
        assert await pg_ids(braid) == ALIVE
