"""``GET /admin/stats``: what each tenant has stored, counted, checked against
memories written through the API with known tiers, supersessions, expiries
and models, and against the outbox as Postgres holds it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import psycopg
import pytest

from config import LifecycleConfig
from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense
from indexers.base import SourceUnavailable

from . import conftest
from .conftest import ADMIN_A, AGENT_A, AGENT_B, Braid, make_app, serve

pytestmark = pytest.mark.anyio

NOW = datetime.now(UTC)
MODEL = "all-MiniLM-L6-v2"


def stamp(dt: datetime) -> str:
    return dt.isoformat().replace("+00:00", "Z")


@pytest.fixture
async def braid(postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any) -> AsyncIterator[Braid]:
    """Session memories kept 30 days (the rag tier keeps them for ever); no
    sweep runs by itself during a test; no entity extracted (the entities
    counted are the ones the memories name)."""
    cfg = conftest.test_config("unused")
    cfg = msgspec.structs.replace(cfg, graph=msgspec.structs.replace(cfg.graph, extract="none"))
    tiers = {**cfg.tiers, "session": msgspec.structs.replace(cfg.tiers["session"], retention_days=30.0)}
    cfg = msgspec.structs.replace(cfg, tiers=tiers, lifecycle=LifecycleConfig(sweep_interval_s=3600.0))
    app, dsn, alias = make_app(postgres, typesense, embedder, cfg)
    async with serve(app) as client:
        yield Braid(client=client, app=app, dsn=dsn, alias=alias)


async def stats(braid: Braid, **params: str) -> dict[str, Any]:
    r = await braid.client.get("/admin/stats", params=params, headers=braid.headers(ADMIN_A))
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


async def execute(braid: Braid, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """One statement straight on the test's database, as its owner."""
    async with await psycopg.AsyncConnection.connect(braid.dsn, autocommit=True) as conn:
        cur = await conn.execute(statement, params)
        return await cur.fetchall() if cur.description else []


async def write_known_memories(braid: Braid) -> None:
    """Tenant A: six memories (four session, two rag), one of them superseded,
    two expired (one past its expires_at, one past the session retention),
    two entities, one of them re-labelled as made by an old model. Tenant B:
    four memories (one session, three rag), one re-labelled, one with the
    writer's own vector of its own model, and one entity."""
    await braid.remember(
        {"id": "a1", "content": "Alpha met Paris and Rome", "entities": ["Paris", "Rome"]},
        {"id": "a2", "content": "Alpha lives in Lyon", "mem_key": "user.city",
         "created_at": stamp(NOW - timedelta(hours=2))},
        {"id": "a4", "content": "Alpha expired yesterday", "tier": "rag",
         "expires_at": stamp(NOW - timedelta(days=1))},
        {"id": "a5", "content": "Alpha forty days old", "created_at": stamp(NOW - timedelta(days=40))},
        {"id": "a6", "content": "Alpha forty days old in rag", "tier": "rag",
         "created_at": stamp(NOW - timedelta(days=40))},
    )  # fmt: skip
    r = await braid.post("/v1/memories", {"memories": [{"id": "a3", "content": "Alpha moved", "mem_key": "user.city"}]})
    assert r.status_code == 201 and r.json()["superseded"] == ["a2"], r.text
    await braid.remember(
        {"id": "b1", "content": "Beta one"},
        {"id": "b2", "content": "Beta two", "tier": "rag"},
        {"id": "b3", "content": "Beta three", "tier": "rag", "entities": ["Zorblax"]},
        {
            "id": "b4",
            "content": "Beta four",
            "tier": "rag",
            "embedding": [1.0] + [0.0] * 383,
            "embedding_model": "writer-model",
        },
        key=AGENT_B,
    )
    await braid.synced()
    await execute(braid, "UPDATE memories SET model = 'old-model' WHERE tenant = 'tenant-b' AND id = 'b1'")
    await execute(braid, "UPDATE entities SET model = 'old-model' WHERE tenant = 'tenant-a' AND name = 'Rome'")


TENANT_A = {
    "tenant": "tenant-a",
    "memories": 6,
    "by_tier": {"rag": 2, "session": 4},
    "by_model": {MODEL: 6},
    "stale_embeddings": 0,
    "entities_by_model": {MODEL: 1, "old-model": 1},
    "superseded": 1,
    "expired": 2,
    "outbox_pending": 0,
}
TENANT_B = {
    "tenant": "tenant-b",
    "memories": 4,
    "by_tier": {"rag": 3, "session": 1},
    "by_model": {MODEL: 2, "writer-model": 1, "old-model": 1},
    "stale_embeddings": 2,
    "entities_by_model": {MODEL: 1},
    "superseded": 0,
    "expired": 0,
    "outbox_pending": 0,
}


def without_tenant(counts: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in counts.items() if k != "tenant"}


async def test_counts_per_tenant_and_totals(braid: Braid) -> None:
    await write_known_memories(braid)
    body = await stats(braid)
    assert body["embedding_model"] == MODEL
    assert body["tenants"] == [TENANT_A, TENANT_B]
    assert body["totals"] == {
        "memories": 10,
        "by_tier": {"rag": 5, "session": 5},
        "by_model": {MODEL: 8, "writer-model": 1, "old-model": 1},
        "stale_embeddings": 2,
        "entities_by_model": {MODEL: 2, "old-model": 1},
        "superseded": 1,
        "expired": 2,
        "outbox_pending": 0,
    }


async def test_expired_counts_what_the_sweeper_removes(braid: Braid) -> None:
    await write_known_memories(braid)
    assert (await stats(braid))["totals"]["expired"] == 2
    assert await braid.runtime.sweeper.sweep() == 2
    await braid.synced()
    body = await stats(braid)
    assert body["tenants"] == [
        {**TENANT_A, "memories": 4, "by_tier": {"rag": 1, "session": 3}, "by_model": {MODEL: 4}, "expired": 0},
        TENANT_B,
    ]


async def test_outbox_pending_is_the_tenants_unapplied_rows(braid: Braid) -> None:
    await write_known_memories(braid)

    async def typesense_refuses(*_: Any, **__: Any) -> None:
        raise SourceUnavailable("typesense", "refused by the test")

    # Typesense "down": the worker rolls back, every outbox row stays pending.
    braid.runtime.sync.apply = typesense_refuses  # type: ignore[method-assign]
    await execute(
        braid,
        "INSERT INTO outbox (tenant, memory_id, op) VALUES"
        " ('tenant-a', 'a1', 'upsert'), ('tenant-a', 'a3', 'upsert'),"
        " ('tenant-b', 'b1', 'upsert'), ('tenant-b', 'b2', 'upsert'), ('tenant-b', 'b9', 'delete')",
    )
    body = await stats(braid)
    assert [t["outbox_pending"] for t in body["tenants"]] == [2, 3]
    assert body["totals"]["outbox_pending"] == 5
    in_postgres = await execute(
        braid, "SELECT tenant, count(*) FROM outbox WHERE processed_at IS NULL GROUP BY tenant ORDER BY tenant"
    )
    assert in_postgres == [("tenant-a", 2), ("tenant-b", 3)]


async def test_one_tenant(braid: Braid) -> None:
    await write_known_memories(braid)
    body = await stats(braid, tenant="tenant-b")
    assert body["tenants"] == [TENANT_B]
    assert body["totals"] == without_tenant(TENANT_B)
    # A tenant with nothing stored is listed with zero counts.
    body = await stats(braid, tenant="tenant-none")
    empty = {"memories": 0, "by_tier": {}, "by_model": {}, "stale_embeddings": 0, "entities_by_model": {},
             "superseded": 0, "expired": 0, "outbox_pending": 0}  # fmt: skip
    assert body["tenants"] == [{"tenant": "tenant-none", **empty}]
    assert body["totals"] == empty


async def test_nothing_stored(braid: Braid) -> None:
    body = await stats(braid)
    assert body["embedding_model"] == MODEL
    assert body["tenants"] == []
    assert body["totals"]["memories"] == 0 and body["totals"]["by_tier"] == {}


async def test_admin_only(braid: Braid) -> None:
    r = await braid.client.get("/admin/stats")
    assert r.status_code == 401
    for key in (AGENT_A, AGENT_B):
        r = await braid.client.get("/admin/stats", headers=braid.headers(key))
        assert r.status_code == 403
        assert r.json()["detail"] == "this endpoint needs an admin key"


@pytest.mark.parametrize("name", ["", "-leading-dash", "has space", "x" * 64, "semi;colon", "tenant\n"])
async def test_an_invalid_tenant_is_400(braid: Braid, name: str) -> None:
    r = await braid.client.get("/admin/stats", params={"tenant": name}, headers=braid.headers(ADMIN_A))
    assert r.status_code == 400, r.text
    assert r.json()["detail"] == (
        f"tenant {name!r} is not a valid tenant name (1-63 letters, digits, _ and -, not starting with -)"
    )


async def test_no_postgres_is_503(braid: Braid) -> None:
    await braid.runtime.store.pool.close()  # the store gets no connection any more
    r = await braid.client.get("/admin/stats", headers=braid.headers(ADMIN_A))
    assert r.status_code == 503, r.text
    assert r.json()["detail"] == "postgres unavailable; retry later"
