"""Generative: any memory or relation the API accepts can be read back and
recalled through every source, with no source degraded, and then deleted.

Inputs are drawn broadly (any text, timestamps across years 1-9999 with any
offset, vectors with huge, tiny and mixed components, nested metadata); a
400 is an acceptable answer, a 500 never is, and whatever is accepted must
round-trip. This is the test that would have caught a timestamp leaving the
calendar in UTC, a relation that poisons graph reads, and a vector stored as
zero.
"""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from .conftest import AGENT_A, Braid

pytestmark = pytest.mark.anyio

ROUNDS = settings(
    derandomize=True,
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
SOURCES = ("typesense", "pgvector", "graph")
_serial = itertools.count()

offsets = st.builds(lambda minutes: timezone(timedelta(minutes=minutes)), st.integers(-23 * 60 - 59, 23 * 60 + 59))
stamps = st.builds(
    lambda dt, tz: dt.replace(tzinfo=tz).isoformat(),
    st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)),
    offsets,
) | st.sampled_from(["0001-01-01T00:30:00+01:00", "9999-12-31T23:30:00-01:00", "0001-01-01T00:00:00Z"])
components = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([1e300, -1e300, 5e-324, 1e-200])
vectors = st.lists(components, min_size=1, max_size=6).map(lambda v: (v * 384)[:384])
texts = st.text(min_size=1, max_size=80)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False, allow_infinity=False) | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
memories = st.fixed_dictionaries(
    {"content": texts},
    optional={
        "kind": st.from_regex(r"\A[a-z][a-z0-9_.:-]{0,10}\Z"),
        "tier": st.sampled_from(["session", "rag"]),
        "tags": st.lists(texts, max_size=3),
        "importance": st.floats(0, 1),
        "confidence": st.floats(0, 1),
        "created_at": stamps,
        "speaker": texts,
        "context": texts,
        "metadata": st.dictionaries(texts, json_values, max_size=3),
        "entities": st.lists(texts, max_size=3),
        "embedding": vectors,
    },
)
relations = st.fixed_dictionaries(
    {"source": texts, "relation": texts, "target": texts},
    optional={"weight": st.floats(0.001, 1000), "valid_from": stamps, "valid_to": stamps},
)


def recall_body(query: str, **fields: Any) -> dict[str, Any]:
    return {"query": query, "min_confidence": 0.0, "top_k": 20, **fields}


async def recall(braid: Braid, body: dict[str, Any]) -> dict[str, Any]:
    r = await braid.post("/v1/recall", body)
    assert r.status_code in (200, 400), r.text
    if r.status_code == 400:  # a query the API refuses (blank, ...), said so
        return {"items": [], "degraded": []}
    result: dict[str, Any] = r.json()
    assert result["degraded"] == [], (body, result["sources"])
    return result


@given(memory=memories)
@ROUNDS
async def test_an_accepted_memory_is_stored_recalled_and_deleted(braid: Braid, memory: dict[str, Any]) -> None:
    mid = f"gen-{next(_serial)}"
    session = f"s-{mid}"
    memory = {**memory, "id": mid, "session_id": session}
    r = await braid.post("/v1/memories", {"memories": [memory]})
    assert r.status_code in (201, 400), r.text
    event(f"memory {r.status_code}")
    if r.status_code == 400:
        return
    await braid.synced()
    with psycopg.connect(braid.dsn) as conn:
        row = conn.execute("SELECT vector_norm(embedding), created_at FROM memories WHERE id = %s", (mid,)).fetchone()
    assert row is not None and abs(row[0] - 1.0) < 1e-4
    doc = await braid.runtime.typesense.get_document(braid.alias, f"tenant-a:{mid}")
    assert doc is not None and doc["content"] == memory["content"]

    vector = {"embedding": memory["embedding"]} if "embedding" in memory else {}
    for source in SOURCES:
        result = await recall(braid, recall_body(memory["content"], sources=[source], session_id=session, **vector))
        if source != "graph":  # found by its own vector, alone in its session
            assert [i["id"] for i in result["items"]] == [mid], (source, result)
    fused = await recall(braid, recall_body(memory["content"], session_id=session, **vector))
    assert [i["id"] for i in fused["items"]] == [mid]

    r = await braid.client.delete(f"/v1/memories/{mid}", headers=braid.headers(AGENT_A))
    assert r.status_code == 200, r.text
    await braid.synced()
    for source in SOURCES:
        result = await recall(braid, recall_body(memory["content"], sources=[source], session_id=session, **vector))
        assert mid not in [i["id"] for i in result["items"]]


@given(relation=relations)
@ROUNDS
async def test_an_accepted_relation_never_degrades_graph_recall(braid: Braid, relation: dict[str, Any]) -> None:
    r = await braid.post("/v1/graph", {"relations": [relation]})
    assert r.status_code in (201, 400), r.text
    event(f"relation {r.status_code}")
    if r.status_code == 400:
        return
    query = f"{relation['source']} {relation['target']}"
    await recall(braid, recall_body(query, sources=["graph"]))
    await recall(braid, recall_body(query))
    r = await braid.client.delete(
        "/v1/graph/relations",
        params={"source": relation["source"], "target": relation["target"], "relation": relation["relation"]},
        headers=braid.headers(AGENT_A),
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"deleted": 1}
