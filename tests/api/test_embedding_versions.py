"""Embedding versions, through the HTTP API against the real Postgres and
Typesense: a vector is compared only with vectors of its own model, in every
source; ``POST /admin/reindex {"target": "embeddings"}`` embeds the other
models' memories and entities again with the service's model, online.

The "old model" memories carry the query's own vector: compared with it,
they would be the nearest of all, so their absence is the filter's doing.
Their words share nothing with the query, so no keyword match brings them."""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
import numpy as np
import psycopg
import pytest

from indexers.postgres.reembed import replace_memories, stale_memories

from .conftest import ADMIN_A, AGENT_B, Braid, patient
from .test_admin import wait_job

pytestmark = pytest.mark.anyio

QUERY = "Which pet does Maria keep at home?"
OLD = "old-model"
CURRENT = [
    "Maria keeps a grey cat called Pixel at home",
    "Maria's neighbour walks a beagle every morning",
    "The pet shop near Maria sells parrots",
]
UNRELATED = [
    "The quarterly budget review moved to Thursday",
    "Invoices are approved by finance within ten days",
    "The staging server runs out of disk on Mondays",
]


async def query_vector(braid: Braid, text: str = QUERY) -> list[float]:
    return list(await braid.runtime.embedder.embed_query(text))


@pytest.fixture
async def mixed(braid: Braid) -> Braid:
    """Three memories of the service's model and three of ``old-model``
    (tenant-a), plus one old-model memory of tenant-b."""
    vec = await query_vector(braid)
    await braid.remember(*({"id": f"cur-{i}", "content": c, "entities": ["Maria"]} for i, c in enumerate(CURRENT)))
    await braid.remember(
        *({"id": f"old-{i}", "content": c, "embedding": vec, "embedding_model": OLD} for i, c in enumerate(UNRELATED))
    )
    await braid.remember(
        {"id": "b-old", "content": UNRELATED[0], "embedding": vec, "embedding_model": OLD}, key=AGENT_B
    )
    await braid.synced()
    return braid


async def recalled(braid: Braid, sources: list[str] | None, key: str | None = None, **fields: Any) -> list[str]:
    body: dict[str, Any] = {"top_k": 20, **fields, **({} if sources is None else {"sources": sources})}
    out = await braid.recall(QUERY, **body, **({} if key is None else {"key": key}))
    assert out["degraded"] == [], out["sources"]
    return [i["id"] for i in out["items"]]


@pytest.mark.parametrize("sources", [["pgvector"], ["typesense"], ["graph"], None], ids=str)
async def test_a_query_vector_meets_only_its_own_models_vectors(mixed: Braid, sources: list[str] | None) -> None:
    got = await recalled(mixed, sources)
    assert not [i for i in got if i.startswith("old-")]
    if sources != ["graph"]:
        assert "cur-0" in got


async def test_a_vector_naming_the_old_model_meets_the_old_vectors(mixed: Braid) -> None:
    """The same recall with the query's vector named ``old-model``: pgvector
    finds exactly the old memories (the control for the test above)."""
    vec = await query_vector(mixed)
    assert set(await recalled(mixed, ["pgvector"], embedding=vec, embedding_model=OLD)) == {"old-0", "old-1", "old-2"}
    # Typesense's vector list holds the old ones; its keyword list still finds CURRENT by words.
    got = await recalled(mixed, ["typesense"], embedding=vec, embedding_model=OLD)
    assert {"old-0", "old-1", "old-2"} <= set(got)
    # Another tenant's old-model memory is never among them.
    assert "b-old" not in got


async def test_the_model_of_each_memory_is_shown_and_a_vector_without_one_is_the_services(mixed: Braid) -> None:
    model = mixed.runtime.embedder.model
    shown = {}
    for mid in ("cur-0", "old-0"):
        r = await mixed.client.get(f"/v1/memories/{mid}", headers=mixed.headers("agent-key-tenant-a-0123456789"))
        assert r.status_code == 200, r.text
        shown[mid] = r.json()["model"]
    assert shown == {"cur-0": model, "old-0": OLD}
    # A vector given without a model is taken to be the service's: compared with the query's.
    vec = await query_vector(mixed)
    await mixed.remember({"id": "given", "content": UNRELATED[1], "embedding": vec})
    assert (await recalled(mixed, ["pgvector"]))[0] == "given"


@pytest.mark.parametrize("path", ["/v1/memories", "/v1/recall"])
async def test_embedding_model_without_embedding_is_400_and_nothing_is_written(mixed: Braid, path: str) -> None:
    body: dict[str, Any] = (
        {"memories": [{"id": "lonely", "content": "a memory", "embedding_model": OLD}]}
        if path == "/v1/memories"
        else {"query": QUERY, "embedding_model": OLD}
    )
    r = await mixed.post(path, body)
    assert r.status_code == 400, r.text
    assert "embedding_model" in r.json()["detail"]
    assert (
        await mixed.client.get("/v1/memories/lonely", headers=mixed.headers("agent-key-tenant-a-0123456789"))
    ).status_code == 404


async def test_reindex_embeddings_re_embeds_the_other_models_online(mixed: Braid) -> None:
    # What is tested is never a degraded answer, not the machine's speed.
    mixed.runtime.engine.config.current = patient(mixed.runtime.engine.config.current)
    model = mixed.runtime.embedder.model
    with psycopg.connect(mixed.dsn, autocommit=True) as conn:
        conn.execute("UPDATE entities SET model = %s WHERE name = 'Maria'", (OLD,))
        (entities,) = conn.execute("SELECT count(*) FROM entities WHERE model = %s", (OLD,)).fetchone() or (0,)
    assert entities == 1

    answers: list[dict[str, Any]] = []
    done = anyio.Event()

    async def recall_throughout() -> None:
        while not done.is_set():
            r = await mixed.post("/v1/recall", {"query": QUERY, "top_k": 10, "track": False})
            answers.append({"status": r.status_code, **(r.json() if r.status_code == 200 else {})})
            await anyio.sleep(0.02)

    async with anyio.create_task_group() as tg:
        tg.start_soon(recall_throughout)
        r = await mixed.post("/admin/reindex", {"target": "embeddings"}, key=ADMIN_A)
        assert r.status_code == 202, r.text
        job = await wait_job(mixed, r.json()["job_id"])
        done.set()
    assert job["status"] == "done", job
    # Three old memories of tenant-a and one of tenant-b; the entity Maria.
    assert job["progress"]["embeddings"] == {
        "model": model,
        "memories": {"done": 4, "total": 4},
        "entities": {"done": 1, "total": 1},
    }
    assert answers and all(a["status"] == 200 and a["degraded"] == [] for a in answers), answers[:3]

    # Postgres holds the service model's embedding of each memory's content now.
    expected = await mixed.runtime.embedder.embed([*UNRELATED, UNRELATED[0], "Maria"])
    with psycopg.connect(mixed.dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT id, model, embedding::text FROM memories WHERE id IN ('old-0', 'old-1', 'old-2', 'b-old') ORDER BY id"
        ).fetchall()
        entity = conn.execute("SELECT model, embedding::text FROM entities WHERE name = 'Maria'").fetchone()
    stored = {mid: (m, np.array(msgspec.json.decode(v))) for mid, m, v in rows}
    for mid, vec in zip(["old-0", "old-1", "old-2", "b-old"], expected[:4], strict=True):
        assert stored[mid][0] == model
        assert float(stored[mid][1] @ np.array(vec)) > 0.999, mid
    assert entity is not None and entity[0] == model
    assert float(np.array(msgspec.json.decode(entity[1])) @ np.array(expected[-1])) > 0.999

    # Typesense got them through the outbox, model included.
    await mixed.synced()
    doc = await mixed.runtime.typesense.get_document(f"{mixed.alias}_vectors", "tenant-a:old-0")
    assert doc["model"] == model
    assert float(np.array(doc["embedding"]) @ np.array(expected[0])) > 0.999
    # Now compared: the memory's own words find it first by vector alone.
    out = await mixed.recall(UNRELATED[0], sources=["pgvector"], top_k=3)
    assert out["items"][0]["id"] == "old-0"

    # Nothing is left for a second job.
    r = await mixed.post("/admin/reindex", {"target": "embeddings"}, key=ADMIN_A)
    again = await wait_job(mixed, r.json()["job_id"])
    assert again["progress"]["embeddings"]["memories"] == {"done": 0, "total": 0}


async def test_a_memory_rewritten_during_the_job_keeps_what_its_writer_wrote(mixed: Braid) -> None:
    """A row re-written between the job's read and its write is left as the
    writer left it; the others of the batch are replaced."""
    pool = mixed.runtime.store.pool
    model = mixed.runtime.embedder.model
    rows = await stale_memories(pool, model, None, 10)
    assert [(r.tenant, r.id) for r in rows] == [
        ("tenant-a", "old-0"),
        ("tenant-a", "old-1"),
        ("tenant-a", "old-2"),
        ("tenant-b", "b-old"),
    ]
    vec = await query_vector(mixed)
    await mixed.remember({"id": "old-1", "content": "Rewritten meanwhile", "embedding": vec, "embedding_model": OLD})
    vectors = await mixed.runtime.embedder.embed([r.content for r in rows])
    assert await replace_memories(pool, rows, vectors, model) == 3
    with psycopg.connect(mixed.dsn, autocommit=True) as conn:
        got = dict(conn.execute("SELECT id, model FROM memories WHERE id LIKE 'old-%' OR id = 'b-old'").fetchall())
    assert got == {"old-0": model, "old-1": OLD, "old-2": model, "b-old": model}


async def test_reindex_embeddings_takes_no_tier(braid: Braid) -> None:
    r = await braid.post("/admin/reindex", {"target": "embeddings", "tier": "session"}, key=ADMIN_A)
    assert r.status_code == 400, r.text
    assert "tier" in r.json()["detail"]
    r = await braid.post("/admin/reindex", {"target": "embeddings"})
    assert r.status_code == 403, r.text
