"""Tenants, and filter values, that a Typesense filter cannot tell apart,
through the HTTP API against the real Postgres and Typesense.

Typesense's exact filter folds case and drops ``-`` and ``_`` from the value
and the stored string alike, so ``tenant:=`tenant-a``` matches the documents
of ``Tenant_A`` too. Braid filters by each tenant's key
(:func:`indexers.typesense.documents.tenant_key`) and checks every hit's
tenant, so neither sees the other's memories, even under the same ids.
The same folding makes a kind, tag or session id filter match other values
(``s-1`` and ``S_1``); the Typesense source checks them on the hits exactly,
as Postgres compares them.
"""

from __future__ import annotations

import pytest

from indexers.typesense.documents import tenant_key

from .conftest import AGENT_A, AGENT_FOLDED, Braid

pytestmark = pytest.mark.anyio

#: The same ids in both tenants: a check of ids alone cannot tell them apart.
A_MEMORIES = [
    {"id": "m1", "content": "The vault code for the harbour office is swordfish"},
    {"id": "m2", "content": "The harbour office opens at nine"},
]
FOLDED_MEMORIES = [
    {"id": "m1", "content": "Lunch with the harbour team is at noon"},
    {"id": "m3", "content": "Swordfish steaks for the harbour team dinner"},
]


async def test_tenants_whose_names_typesense_folds_together_see_only_their_own(braid: Braid) -> None:
    await braid.remember(*A_MEMORIES, key=AGENT_A)
    await braid.remember(*FOLDED_MEMORIES, key=AGENT_FOLDED)
    await braid.synced()
    ts, alias = braid.runtime.typesense, braid.alias
    # The premise: by name, Typesense's filter holds both tenants' documents.
    assert await ts.count(alias, "tenant:=`tenant-a`") == 4
    assert await ts.count(alias, f"tenant_key:={tenant_key('tenant-a')}") == 2
    assert await ts.count(alias, f"current_key:={tenant_key('Tenant_A')}") == 2

    own = {
        AGENT_A: {m["id"]: m["content"] for m in A_MEMORIES},
        AGENT_FOLDED: {m["id"]: m["content"] for m in FOLDED_MEMORIES},
    }
    for key, other in ((AGENT_A, AGENT_FOLDED), (AGENT_FOLDED, AGENT_A)):
        for sources in (["typesense"], None):
            for as_of in (None, "2999-01-01T00:00:00Z"):
                body = {"top_k": 10, "sources": sources, "as_of": as_of}
                out = await braid.recall("vault code swordfish harbour lunch", key=key, **body)
                items = {i["id"]: i["content"] for i in out["items"]}
                assert items, (key, sources, as_of)
                assert items.items() <= own[key].items(), (key, sources, as_of, items)
                assert not any(text in out["block"] for text in own[other].values())


async def test_a_filter_value_typesense_folds_matches_only_itself(braid: Braid) -> None:
    ids = await braid.remember(
        {"content": "Harbour crane inspection notes", "session_id": "s-1", "tags": ["to-do"], "kind": "to-do"},
        {"content": "Harbour crane inspection photos", "session_id": "S_1", "tags": ["todo"], "kind": "todo"},
    )
    await braid.synced()
    ts, alias = braid.runtime.typesense, braid.alias
    # The premise: by value, Typesense's filter holds both memories.
    assert await ts.count(alias, "session_id:=`s-1`") == 2
    for filters in ({"session_id": "s-1"}, {"tags": ["to-do"]}, {"kinds": ["to-do"]}, {"tags": ["to-do", "x"]}):
        for sources in (["typesense"], None):
            out = await braid.recall("harbour crane inspection", top_k=10, sources=sources, **filters)
            assert [i["id"] for i in out["items"]] == [ids[0]], (filters, sources, out["items"])
