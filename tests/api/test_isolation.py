"""Randomized tenant isolation: many tenants write overlapping memories and
graphs (the same words, entity names and client-chosen ids), then every
tenant recalls through every source and fused; no answer may hold a row of
another tenant. Row ownership is read from Postgres as the owner, not
inferred from the answers.

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
    tenants = [f"iso-{n:03d}" for n in range(TENANTS)]
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
        facts = {f"rel:{rid}": t for rid, t in conn.execute("SELECT id, tenant FROM relations")}
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
            load=f"{TENANTS} tenants, same words, entity names and memory ids in every tenant",
            requests=requests,
            leaks=len(leaks),
            outcome=f"{answered} items returned over {TENANTS * QUERIES * len(SOURCES)} recalls "
            f"(typesense, pgvector, graph, fused); {len(leaks)} not the tenant's own",
        )
    )
    assert answered > TENANTS * QUERIES * len(SOURCES)  # the check saw real answers
    assert leaks == [], f"seed {seed}: {leaks[:5]}"


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
