"""Randomized tenant isolation: many tenants write overlapping memories and
graphs (the same words, entity names and client-chosen ids), then every
tenant recalls through every source and fused; no answer may hold a row of
another tenant. Row ownership is read from Postgres as the owner, not
inferred from the answers.

Tenants come in pairs whose names differ only in case, ``-`` and ``_``
(``iso-007`` and ``ISO_007``), which Typesense's exact filter folds together:
a pair must stay apart as any two tenants.

``BRAID_ISOLATION_SEED`` picks another corpus (the seed is printed)."""

from __future__ import annotations

import os
import random
from typing import Any

import msgspec
import psycopg
import pytest

from benchmarks.faults.ledger import Ledger, Scenario
from config import CacheConfig

from . import conftest
from .conftest import Braid

pytestmark = [pytest.mark.anyio, pytest.mark.faults]

TENANTS = 24
MEMORIES = 8
QUERIES = 3
WORDS = (
    "password blue garden launch budget Paris Tokyo guitar marathon allergy peanuts "
    "TypeScript Honda meeting Tuesday deadline invoice birthday sister dentist"
).split()
PEOPLE = ["Alex", "Sam", "Jordan", "Riley", "Casey"]
SOURCES: list[list[str] | None] = [["typesense"], ["pgvector"], ["graph"], None]


def key_of(n: int) -> str:
    return f"isolation-key-{n:03d}-0123456789abcdef"


async def test_no_recall_of_any_source_shows_another_tenants_rows(braid: Braid, ledger: Ledger) -> None:
    seed = int(os.environ.get("BRAID_ISOLATION_SEED", "20261123"))
    rng = random.Random(seed)
    # Pairs of names Typesense's `:=` folds together (case, `-`, `_`).
    tenants = [f"iso-{n // 2:03d}" if n % 2 == 0 else f"ISO_{n // 2:03d}" for n in range(TENANTS)]
    for n, tenant in enumerate(tenants):
        braid.app.state.keyring.add(key_of(n), tenant=tenant, role="agent")

    requests = 0
    for n, tenant in enumerate(tenants):
        people = rng.sample(PEOPLE, 3)
        r = await braid.post(
            "/v1/graph",
            {
                "entities": [{"name": p} for p in people],
                "relations": [
                    {"source": people[0], "relation": "knows", "target": people[1]},
                    {"source": people[1], "relation": "works_with", "target": people[2]},
                ],
            },
            key_of(n),
        )
        assert r.status_code == 201, r.text
        memories = [
            {
                # Ids collide across tenants on purpose; each must stay the tenant's own.
                "id": f"m{i}",
                "content": " ".join(rng.sample(WORDS, 6)) + f" {rng.choice(people)}",
                "entities": rng.sample(people, 2),
                "tags": rng.sample(["home", "work", "health"], 1),
            }
            for i in range(MEMORIES)
        ]
        await braid.remember(*memories, key=key_of(n))
        requests += 2
    await braid.synced(timeout=60)

    # Who owns what, read as the owner straight from Postgres.
    with psycopg.connect(braid.dsn) as conn:
        contents = {(t, mid): c for t, mid, c in conn.execute("SELECT tenant, id, content FROM memories")}
        # The clients' relations (extracted ones are walked, never returned as facts).
        facts = {f"rel:{rid}": t for rid, t in conn.execute("SELECT id, tenant FROM relations WHERE NOT derived")}
    assert len(contents) == TENANTS * MEMORIES and len(facts) == TENANTS * 2

    leaks: list[tuple[str, Any, dict[str, Any]]] = []
    answered = 0
    for n, tenant in enumerate(tenants):
        for _ in range(QUERIES):
            query = " ".join(rng.sample(WORDS + PEOPLE, 3))
            for sources in SOURCES:
                fields: dict[str, Any] = {"top_k": 50}
                if sources:
                    fields["sources"] = sources
                if rng.random() < 0.3:
                    fields["tags"] = [rng.choice(["home", "work", "health"])]
                out = await braid.recall(query, key=key_of(n), **fields)
                requests += 1
                assert out["degraded"] == [], out["sources"]
                for item in out["items"]:
                    answered += 1
                    if item["kind"] == "fact":
                        own = facts.get(item["id"]) == tenant
                    else:
                        own = contents.get((tenant, item["id"])) == item["content"]
                    if not own:
                        leaks.append((tenant, sources, item))
    ledger.record(
        Scenario(
            name=f"randomized isolation: {TENANTS} tenants x {MEMORIES} memories + graph, seed {seed}",
            kind="isolation",
            injected=TENANTS * QUERIES * len(SOURCES),
            load=f"{TENANTS} tenants (in pairs whose names Typesense folds together), same words, entity names"
            " and memory ids in every tenant",
            requests=requests,
            leaks=len(leaks),
            outcome=f"{answered} items returned over {TENANTS * QUERIES * len(SOURCES)} recalls "
            f"(typesense, pgvector, graph, fused); {len(leaks)} not the tenant's own",
        )
    )
    assert answered > TENANTS * QUERIES * len(SOURCES)  # the check saw real answers
    assert leaks == [], f"seed {seed}: {leaks[:5]}"


async def test_the_lifecycle_of_one_tenant_never_touches_another(braid: Braid) -> None:
    """Supersession, versions, GET of one memory, restore_previous and as_of,
    with the same ids and mem_key in two tenants: each tenant sees and
    changes its own rows only."""
    from .conftest import AGENT_A, AGENT_B

    def memory(mid: str, city: str, day: int) -> dict[str, Any]:
        return {
            "id": mid,
            "content": f"Home city is {city}",
            "mem_key": "user.city",
            "entities": ["home city"],
            "created_at": f"2026-0{day}-01T00:00:00Z",
        }

    async def write(key: str, m: dict[str, Any]) -> Any:
        r = await braid.post("/v1/memories", {"memories": [m]}, key)
        assert r.status_code == 201, r.text
        return r.json()

    assert (await write(AGENT_A, memory("k1", "Lisbon", 1)))["superseded"] == []
    # B's newer version of the same key (and id) retires nothing of A's.
    assert (await write(AGENT_B, memory("k1", "Oslo", 2)))["superseded"] == []
    assert (await write(AGENT_B, memory("k2", "Bergen", 3)))["superseded"] == ["k1"]
    await braid.synced()

    async def get(key: str, path: str, **params: str) -> Any:
        return await braid.client.get(path, params=params, headers=braid.headers(key))

    a = (await get(AGENT_A, "/v1/memories/k1")).json()
    assert (a["content"], a["current"], a["superseded_by"]) == ("Home city is Lisbon", True, None)
    assert (await get(AGENT_A, "/v1/memories/k2")).status_code == 404
    versions = (await get(AGENT_A, "/v1/memories", mem_key="user.city")).json()["memories"]
    assert [m["content"] for m in versions] == ["Home city is Lisbon"]
    versions = (await get(AGENT_B, "/v1/memories", mem_key="user.city")).json()["memories"]
    assert [(m["id"], m["content"]) for m in versions] == [("k2", "Home city is Bergen"), ("k1", "Home city is Oslo")]

    for sources in SOURCES:
        fields: dict[str, Any] = {"sources": sources} if sources else {}
        out = await braid.recall("home city", key=AGENT_A, **fields)
        assert [(i["id"], i["content"]) for i in out["items"]] == [("k1", "Home city is Lisbon")], sources
        out = await braid.recall("home city", key=AGENT_A, as_of="2026-02-15T00:00:00Z", **fields)
        assert [(i["id"], i["content"]) for i in out["items"]] == [("k1", "Home city is Lisbon")], sources

    # B's delete with restore brings back B's own k1; A's k1 is as it was.
    r = await braid.client.delete(
        "/v1/memories/k2", params={"restore_previous": "true"}, headers=braid.headers(AGENT_B)
    )
    assert r.json() == {"deleted": "k2", "restored": "k1"}
    assert (await get(AGENT_B, "/v1/memories/k1")).json()["content"] == "Home city is Oslo"
    assert (await get(AGENT_A, "/v1/memories/k1")).json()["superseded_at"] is None
    r = await braid.client.delete("/v1/memories/k2", headers=braid.headers(AGENT_A))
    assert r.status_code == 404


async def test_expiry_sweeps_and_cached_answers_stay_within_a_tenant(
    postgres: Any, typesense: Any, embedder: Any
) -> None:
    """The same id in two tenants, one expired: the sweep removes that one only.
    A cached answer is the tenant's own, and another tenant's writes leave it be."""
    cfg = msgspec.structs.replace(conftest.test_config("unused"), cache=CacheConfig(ttl_ms=60_000))
    app, dsn, alias = conftest.make_app(postgres, typesense, embedder, cfg)
    async with conftest.serve(app) as client:
        braid = Braid(client=client, app=app, dsn=dsn, alias=alias)
        await braid.remember({"id": "shared", "content": "Lemur sighting at dawn"})
        await braid.remember(
            {"id": "shared", "content": "Lemur sighting at dusk", "expires_at": "2020-01-01T00:00:00Z"},
            key=conftest.AGENT_B,
        )
        await braid.synced()
        assert await braid.runtime.sweeper.sweep() == 1
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            cur = await conn.execute("SELECT tenant, id FROM memories ORDER BY 1")
            assert await cur.fetchall() == [("tenant-a", "shared")]
        await braid.synced()

        assert (await braid.recall("lemur sighting"))["cached"] is False
        mine = await braid.recall("lemur sighting")
        assert mine["cached"] is True and [i["content"] for i in mine["items"]] == ["Lemur sighting at dawn"]
        await braid.remember({"content": "Lemur sighting at noon"}, key=conftest.AGENT_B)
        assert (await braid.recall("lemur sighting"))["cached"] is True
        theirs = await braid.recall("lemur sighting", key=conftest.AGENT_B)
        assert theirs["cached"] is False
        assert [i["content"] for i in theirs["items"]] == ["Lemur sighting at noon"]
