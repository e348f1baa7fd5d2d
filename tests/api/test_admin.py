"""Admin endpoints: online reindex and config reload."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from config import load_config
from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense

from .conftest import ADMIN_A, AGENT_A, AGENT_B, Braid, FileConfigured, make_app, patient, serve

pytestmark = pytest.mark.anyio

TOPICS = ["billing", "deploys", "hiring", "the roadmap", "security reviews", "the offsite"]
QUERIES = ["who owns billing", "when do deploys happen", "security", "offsite plans"]


async def wait_job(braid: Braid, job_id: str, timeout: float = 120) -> dict[str, Any]:
    with anyio.fail_after(timeout):
        while True:
            r = await braid.client.get(f"/admin/reindex/{job_id}", headers=braid.headers(ADMIN_A))
            assert r.status_code == 200, r.text
            job = r.json()
            if job["status"] not in ("queued", "running"):
                return job  # type: ignore[no-any-return]
            await anyio.sleep(0.05)


async def reindex_typesense(braid: Braid) -> None:
    """Rebuild the tenant's Typesense collection from Postgres through the
    admin endpoint and wait until the job is done and the alias moved."""
    old = await braid.runtime.index.of("tenant-a").current_collection()
    r = await braid.post("/admin/reindex", {"target": "typesense"}, key=ADMIN_A)
    assert r.status_code == 202, r.text
    job = await wait_job(braid, r.json()["job_id"])
    assert job["status"] == "done", job
    assert await braid.runtime.index.of("tenant-a").current_collection() != old
    # Its bulk writes and the old collection's drop done, every node compacted its store.
    compact = job["progress"]["compact"]
    assert compact["phase"] == "done" and compact["seconds"] >= 0, compact
    assert list(compact["nodes"].values()) == ["ok"] * len(braid.runtime.index.client.nodes), compact


async def test_reindex_all_while_recalling(braid: Braid) -> None:
    # What is tested is that a reindex never breaks a recall, not the machine's
    # speed: deadlines a loaded machine cannot miss.
    braid.runtime.engine.config.current = patient(braid.runtime.engine.config.current)
    await braid.remember(
        *(
            {
                "content": f"Note {i} about {TOPICS[i % len(TOPICS)]}: item {i * 7 % 13}",
                "tier": ["session", "rag"][i % 2],
            }
            for i in range(300)
        )
    )
    await braid.synced()
    before = {q: [i["id"] for i in (await braid.recall(q, top_k=10))["items"]] for q in QUERIES}
    old_collection = await braid.runtime.index.of("tenant-a").current_collection()

    errors: list[str] = []
    recalls = 0
    done = anyio.Event()

    async def recall_loop() -> None:
        nonlocal recalls
        while not done.is_set():
            for q in QUERIES:
                r = await braid.post("/v1/recall", {"query": q, "top_k": 10})
                recalls += 1
                if r.status_code != 200:
                    errors.append(f"{r.status_code} {r.text}")
                elif r.json()["degraded"]:
                    errors.append(f"degraded {r.json()['degraded']}")

    async with anyio.create_task_group() as tg:
        tg.start_soon(recall_loop)
        r = await braid.post("/admin/reindex", {"target": "all"}, key=ADMIN_A)
        assert r.status_code == 202, r.text
        job = await wait_job(braid, r.json()["job_id"])
        done.set()

    assert job["status"] == "done", job
    assert job["progress"]["typesense"]["phase"] == "switched"
    assert job["progress"]["typesense"]["done"] == 300
    assert errors == []
    assert recalls > 0
    new_collection = await braid.runtime.index.of("tenant-a").current_collection()
    assert new_collection != old_collection
    after = {q: [i["id"] for i in (await braid.recall(q, top_k=10))["items"]] for q in QUERIES}
    assert after == before


async def test_reindex_pgvector_applies_new_hnsw_settings(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any, tmp_path: Path
) -> None:
    path = tmp_path / "braid.yaml"
    text = Path(load_config.__globals__["DEFAULT_CONFIG_PATH"]).read_text()
    path.write_text(text)
    app, dsn, alias = make_app(postgres, typesense, embedder, load_config(path), str(path))
    async with serve(app) as client:
        braid = Braid(client=client, app=app, dsn=dsn, alias=alias)
        text = text.replace("collection: braid_memories", f"collection: {alias}")
        path.write_text(text.replace("    m: 24\n    efConstruction: 128", "    m: 12\n    efConstruction: 48", 1))
        r = await braid.post("/admin/config/reload", {}, key=ADMIN_A)
        assert r.status_code == 200, r.text
        assert r.json()["reindex_required"] == ["tiers.session.efConstruction", "tiers.session.m"]
        assert r.json()["restart_required"] == []
        r = await braid.post("/admin/reindex", {"target": "pgvector", "tier": "session"}, key=ADMIN_A)
        job = await wait_job(braid, r.json()["job_id"])
        assert job["status"] == "done", job
        from indexers.pgvector import index_params

        params = await index_params(braid.runtime.store.pool, "memories_hnsw_session")
        assert params == {"m": 12, "ef_construction": 48}


async def test_config_reload_applies_and_bad_file_keeps_old(configured: FileConfigured) -> None:
    braid = configured.braid
    await braid.remember(*({"content": f"Fact number {i} about the garden"} for i in range(8)))
    await braid.synced()
    assert len((await braid.recall("garden"))["items"]) == 8

    configured.write("searchTopK: 3\n")
    r = await configured.reload()
    assert r.status_code == 200 and r.json()["reloaded"] is True
    assert len((await braid.recall("garden"))["items"]) == 3

    configured.write("searchTopK: 3\nrrf:\n  k: 0\n")
    r = await configured.reload()
    assert r.status_code == 400
    assert r.json()["detail"] == (
        f"config not reloaded, the running config stays: {configured.path}: Expected `int` >= 1 - at `$.rrf.k`"
    )
    assert len((await braid.recall("garden"))["items"]) == 3

    r = await configured.reload(key=AGENT_A)
    assert r.status_code == 403


TIERS = "tiers:\n  {first}:\n    holds: memories\n  entities:\n    holds: entities\n  {second}:\n    holds: memories\n"


async def test_reload_refuses_to_remove_a_tier_that_holds_memories(configured: FileConfigured) -> None:
    """Renaming the default tier used to reload fine and then refuse every write
    without `tier` and find nothing: now the reload is refused, the running config
    stays, and a tier may be renamed once it is empty."""
    braid = configured.braid
    await braid.remember({"content": "The garden gate is green", "id": "g1"})
    await braid.synced()

    configured.write("defaultTier: chat\n" + TIERS.format(first="chat", second="rag"))
    r = await configured.reload()
    assert r.status_code == 400
    assert r.json()["detail"] == (
        "config not reloaded, the running config stays: the new config removes tier(s) "
        "['session'] that hold memories; keep them (a tier may be renamed only once it is "
        "empty); config not reloaded"
    )
    await braid.remember({"content": "The garden shed is blue", "id": "g2"})
    await braid.synced()
    assert {i["id"] for i in (await braid.recall("garden"))["items"]} == {"g1", "g2"}

    # The default tier must hold memories.
    configured.write("defaultTier: entities\n")
    r = await configured.reload()
    assert r.status_code == 400
    assert "defaultTier 'entities' is not a tier holding memories" in r.json()["detail"]

    # `rag` is empty: renaming it is fine, and the default tier can move.
    configured.write("defaultTier: archive\n" + TIERS.format(first="session", second="archive"))
    r = await configured.reload()
    assert r.status_code == 200, r.text
    await braid.remember({"content": "The garden path is gravel", "id": "g3"})
    await braid.synced()
    items = {i["id"]: i["tier"] for i in (await braid.recall("garden"))["items"]}
    assert items == {"g1": "session", "g2": "session", "g3": "archive"}


async def test_reload_names_keys_that_need_a_restart(configured: FileConfigured) -> None:
    before = configured.braid.runtime.engine.config.current
    configured.write(
        "searchTopK: 4\nserver:\n  port: 9999\n  maxBodyBytes: 2048\nsync:\n  batchSize: 8\n"
        "embedding:\n  queryDeadlineMs: 400\n"
    )
    r = await configured.reload()
    assert r.status_code == 200, r.text
    assert r.json()["restart_required"] == ["server.maxBodyBytes", "server.port", "sync.batchSize"]
    now = configured.braid.runtime.engine.config.current
    # The rest is in force; the start-up keys keep their running values.
    assert now.search_top_k == 4
    assert now.embedding.query_deadline_ms == 400  # read at every recall: reloadable
    assert now.server == before.server and now.sync == before.sync

    configured.write("embedding:\n  writeBatch: 8\n")
    r = await configured.reload()
    assert r.status_code == 400
    assert r.json()["detail"] == (
        "config not reloaded, the running config stays: "
        "`embedding` cannot change without a restart; config not reloaded"
    )

    # The replica's pool is opened at start-up: naming one needs a restart too.
    configured.write("postgres:\n  replicaDsn: postgresql://127.0.0.1:5999/braid\n")
    r = await configured.reload()
    assert r.status_code == 400
    assert r.json()["detail"] == (
        "config not reloaded, the running config stays: `postgres` cannot change without a restart; config not reloaded"
    )


async def test_an_admin_key_acts_on_every_tenant(braid: Braid) -> None:
    """Documented decision (README, "Keys and tenants"): an admin key is an
    operator's; /admin endpoints act on the whole deployment, not on the key's
    tenant. A reindex rebuilds every tenant's documents and its job counts them all."""
    await braid.remember(*({"content": f"Tenant A note {i}"} for i in range(3)))
    await braid.remember(*({"content": f"Tenant B note {i}"} for i in range(5)), key=AGENT_B)
    await braid.synced()
    r = await braid.post("/admin/reindex", {"target": "all"}, key=ADMIN_A)
    assert r.status_code == 202, r.text
    job = await wait_job(braid, r.json()["job_id"])
    assert job["status"] == "done", job
    assert job["progress"]["typesense"]["done"] == 8
    assert len((await braid.recall("Tenant B note", key=AGENT_B))["items"]) == 5
    assert len((await braid.recall("Tenant A note"))["items"]) == 3


async def test_one_reindex_at_a_time(braid: Braid) -> None:
    import psycopg

    with psycopg.connect(braid.dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO reindex_jobs (id, target, status) VALUES ('job-in-the-way', 'all', 'running')")
    r = await braid.post("/admin/reindex", {"target": "typesense"}, key=ADMIN_A)
    assert r.status_code == 409
    assert r.json()["detail"] == (
        "reindex job job-in-the-way is still running; wait for it (GET /admin/reindex/job-in-the-way)"
    )
    assert r.json()["job_id"] == "job-in-the-way"
    with psycopg.connect(braid.dsn, autocommit=True) as conn:
        conn.execute("UPDATE reindex_jobs SET status = 'done' WHERE id = 'job-in-the-way'")
    r = await braid.post("/admin/reindex", {"target": "typesense"}, key=ADMIN_A)
    assert r.status_code == 202
    assert (await wait_job(braid, r.json()["job_id"]))["status"] == "done"


async def test_the_key_is_checked_before_the_body_is_read(braid: Braid) -> None:
    bad_body = b'{"query": '
    r = await braid.client.post("/v1/recall", content=bad_body)
    assert r.status_code == 401
    r = await braid.client.post("/v1/recall", content=bad_body, headers=braid.headers("not-a-key-0123456789"))
    assert r.status_code == 401
    r = await braid.client.post("/admin/reindex", content=bad_body, headers=braid.headers(AGENT_A))
    assert r.status_code == 403
    r = await braid.client.post("/v1/recall", content=bad_body, headers=braid.headers(AGENT_A))
    assert r.status_code == 400


async def test_start_up_leaves_alone_a_job_another_live_process_runs(braid: Braid) -> None:
    import anyio
    import psycopg

    lock = "SELECT pg_advisory_lock(hashtextextended('braid-reindex:' || %s, 0))"
    other = await psycopg.AsyncConnection.connect(braid.dsn, autocommit=True)
    try:
        # Another replica's running job: its row, and the lock its process holds.
        await other.execute(lock, ("elsewhere",))
        await other.execute("INSERT INTO reindex_jobs (id, target, status) VALUES ('elsewhere', 'all', 'running')")
        assert await braid.runtime.jobs.mark_interrupted() == 0
        r = await braid.client.get("/admin/reindex/elsewhere", headers=braid.headers(ADMIN_A))
        assert r.json()["status"] == "running"
    finally:
        await other.close()  # that process dies; its lock goes with its connection
    with anyio.fail_after(10):
        while await braid.runtime.jobs.mark_interrupted() == 0:
            await anyio.sleep(0.1)
    r = await braid.client.get("/admin/reindex/elsewhere", headers=braid.headers(ADMIN_A))
    assert r.json()["status"] == "interrupted"
    # A job of this process holds its lock until it ends, then gives it back.
    r = await braid.post("/admin/reindex", {"target": "pgvector", "tier": "session"}, key=ADMIN_A)
    job_id = r.json()["job_id"]
    assert (await wait_job(braid, job_id))["status"] == "done"
    async with await psycopg.AsyncConnection.connect(braid.dsn, autocommit=True) as conn:
        with anyio.fail_after(10):  # released just after the job's status says done
            while True:
                cur = await conn.execute(
                    "SELECT pg_try_advisory_xact_lock(hashtextextended('braid-reindex:' || %s, 0))",
                    (job_id,),
                )
                if await cur.fetchone() == (True,):
                    break
                await anyio.sleep(0.05)
