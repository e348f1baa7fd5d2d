"""Braid itself SIGKILLed, then restarted with the same config.

* Mid-write: concurrent writers send batches with their own ids while the
  process is killed. After the restart every acknowledged write is in
  Postgres, reaches Typesense through the outbox and is recalled by pgvector;
  an unacknowledged batch is all there or not at all; retrying it with the
  same ids leaves exactly one row and one document per id.
* Mid-reindex: the old Typesense collection keeps serving, the job reads
  ``interrupted``, its half-built collection is dropped at start-up, and a
  new reindex completes.
"""

from __future__ import annotations

import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import psycopg
import pytest
from psycopg.types.json import Jsonb

from benchmarks.faults.ledger import Ledger, Scenario
from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense
from tests.api.conftest import ADMIN_A, Braid, make_app, serve

from .service_proc import ADMIN_KEY, TENANT, ServiceProcess

pytestmark = pytest.mark.anyio

SEED = int(os.environ.get("BRAID_FAULT_SEED", "4242"))

ADJECTIVES = ["amber", "brisk", "copper", "dusty", "eager", "frosty", "gentle", "hollow", "ivory", "jolly"]
NOUNS = ["anchor", "beacon", "canyon", "dagger", "ember", "falcon", "glacier", "harbor", "island", "juniper"]
PLACES = ["attic", "bakery", "chapel", "dock", "estate", "forge", "garden", "hangar", "inn", "jetty"]


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="braid-crash-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def service(home: Path, postgres: EmbeddedPostgres, typesense: EmbeddedTypesense) -> Iterator[ServiceProcess]:
    svc = ServiceProcess(home, postgres, typesense)
    try:
        yield svc
    finally:
        svc.stop()


def sentence(rng: random.Random, mid: str) -> str:
    return f"{mid} remembers the {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)} near the {rng.choice(PLACES)}"


async def outbox_drained(svc: ServiceProcess, timeout: float = 120) -> float:
    """Wait until no outbox row is pending (read from Postgres directly); returns seconds."""
    started = time.monotonic()
    async with await svc.pg() as conn:
        while True:
            cur = await conn.execute("SELECT count(*) FROM outbox WHERE processed_at IS NULL")
            row = await cur.fetchone()
            assert row is not None
            if row[0] == 0:
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                raise AssertionError(f"outbox still has {row[0]} pending rows after {timeout}s:\n{svc.output()}")
            await anyio.sleep(0.1)


async def typesense_docs(svc: ServiceProcess, ids: list[str], alias: str | None = None) -> dict[str, dict[str, Any]]:
    """The documents Typesense holds behind ``alias`` (default: the keyword
    alias) for ``ids``, by memory id."""
    found = {}
    async with svc.typesense_client() as ts:
        for mid in ids:
            r = await ts.get(f"/collections/{alias or svc.alias}/documents/{TENANT}:{mid}")
            if r.status_code == 200:
                found[mid] = r.json()
            else:
                assert r.status_code == 404, r.text
    return found


async def typesense_count(svc: ServiceProcess, collection: str | None = None) -> int:
    async with svc.typesense_client() as ts:
        r = await ts.get(
            f"/collections/{collection or svc.alias}/documents/search",
            params={"q": "*", "query_by": "content", "filter_by": f"tenant:={TENANT}", "per_page": 0},
        )
        assert r.status_code == 200, r.text
        return int(r.json()["found"])


async def collections(svc: ServiceProcess) -> set[str]:
    """Every Typesense collection of this service's aliases (``<alias>_<ms>``
    and ``<alias>_<ms>_vectors``)."""
    async with svc.typesense_client() as ts:
        r = await ts.get("/collections")
        assert r.status_code == 200, r.text
        return {c["name"] for c in r.json() if c["name"].startswith(f"{svc.alias}_")}


async def alias_target(svc: ServiceProcess) -> str:
    async with svc.typesense_client() as ts:
        r = await ts.get(f"/aliases/{svc.alias}")
        assert r.status_code == 200, r.text
        return str(r.json()["collection_name"])


# --- SIGKILL mid-write ---------------------------------------------------------

WRITERS = 4
BATCH = 8


@pytest.mark.faults
async def test_sigkill_mid_write_loses_no_acknowledged_write(service: ServiceProcess, ledger: Ledger) -> None:
    rng = random.Random(SEED)
    kill_after = rng.randint(4, 12)  # acknowledged batches before the kill
    kill_delay = rng.uniform(0.0, 0.3)
    batches: dict[str, list[dict[str, Any]]] = {}
    acked: list[str] = []  # batch names, in acknowledgement order
    unacked: list[str] = []  # sent (or about to be) when the service died
    counts = {"requests": 0, "connection_errors": 0}
    statuses: list[int] = []  # of every answer Braid gave

    service.start()
    service.wait_healthy()

    async def writer(w: int, client: httpx.AsyncClient) -> None:
        b = 0
        while True:
            name = f"w{w}-b{b}"
            batch = [{"id": f"{name}-{i}", "content": sentence(rng, f"{name}-{i}")} for i in range(BATCH)]
            batches[name] = batch
            counts["requests"] += 1
            try:
                r = await client.post("/v1/memories", json={"memories": batch}, headers=service.auth())
            except httpx.TransportError:
                counts["connection_errors"] += 1
                unacked.append(name)
                return
            statuses.append(r.status_code)
            if r.status_code != 201:
                unacked.append(name)
                return
            assert r.json()["ids"] == [m["id"] for m in batch]
            acked.append(name)
            b += 1

    async def killer() -> None:
        # Writers only stop on an error; if they all did before the kill, fail below.
        while len(acked) < kill_after and len(unacked) < WRITERS:
            await anyio.sleep(0.01)
        await anyio.sleep(kill_delay)
        await anyio.to_thread.run_sync(service.sigkill)

    async with service.client() as client, anyio.create_task_group() as tg:
        for w in range(WRITERS):
            tg.start_soon(writer, w, client)
        tg.start_soon(killer)
    killed_at = time.monotonic()
    async with await service.pg() as conn:
        cur = await conn.execute("SELECT count(*) FROM outbox WHERE processed_at IS NULL")
        (pending_at_kill,) = await cur.fetchone()  # type: ignore[misc]

    service.start()
    recovery_s = service.wait_healthy()
    restart_to_healthy_after_kill = time.monotonic() - killed_at

    def ids_of(names: list[str]) -> list[str]:
        return [m["id"] for n in names for m in batches[n]]

    acked_ids = ids_of(acked)
    async with await service.pg() as conn:
        # Before any retry: an unacknowledged batch committed whole or not at all.
        cur = await conn.execute(
            "SELECT id FROM memories WHERE tenant = %s AND id = ANY(%s)", (TENANT, ids_of(unacked))
        )
        present = {r[0] for r in await cur.fetchall()}
        half_written = [n for n in unacked if 0 < sum(m["id"] in present for m in batches[n]) < BATCH]
        committed_unacked = [n for n in unacked if all(m["id"] in present for m in batches[n])]

        cur = await conn.execute(
            "SELECT id, vector_dims(embedding), model, content FROM memories WHERE tenant = %s AND id = ANY(%s)",
            (TENANT, acked_ids),
        )
        rows = {r[0]: r[1:] for r in await cur.fetchall()}
    contents = {m["id"]: m["content"] for batch in batches.values() for m in batch}
    pg_ok = {
        mid
        for mid, (dims, model, content) in rows.items()
        if dims == 384 and model == "all-MiniLM-L6-v2" and content == contents[mid]
    }
    drain_s = await outbox_drained(service)
    ts_docs = await typesense_docs(service, acked_ids)
    ts_vectors = await typesense_docs(service, acked_ids, f"{service.alias}_vectors")
    ts_ok = {
        mid
        for mid, doc in ts_docs.items()
        if doc["content"] == contents[mid] and len(ts_vectors.get(mid, {}).get("embedding", [])) == 384
    }

    # pgvector recalls a sample of the acknowledged writes by their own text.
    sample = rng.sample(acked_ids, min(8, len(acked_ids)))
    pgvector_missing = []
    async with service.client() as client:
        for mid in sample:
            counts["requests"] += 1
            r = await client.post(
                "/v1/recall",
                json={"query": contents[mid], "sources": ["pgvector"], "top_k": 3},
                headers=service.auth(),
            )
            statuses.append(r.status_code)
            assert r.status_code == 200, r.text
            assert r.json()["degraded"] == []
            if mid not in [i["id"] for i in r.json()["items"]]:
                pgvector_missing.append(mid)

        # The client retries what was not acknowledged, with the same ids.
        for name in unacked:
            counts["requests"] += 1
            r = await client.post("/v1/memories", json={"memories": batches[name]}, headers=service.auth())
            statuses.append(r.status_code)
            assert r.status_code == 201, r.text
    await outbox_drained(service)

    all_ids = ids_of(acked + unacked)
    async with await service.pg() as conn:
        cur = await conn.execute("SELECT count(*), count(DISTINCT id) FROM memories WHERE tenant = %s", (TENANT,))
        pg_rows, pg_distinct = await cur.fetchone()  # type: ignore[misc]
    ts_total = await typesense_count(service)
    ts_after = await typesense_docs(service, all_ids)

    lost = sorted((set(acked_ids) - pg_ok) | (set(acked_ids) - ts_ok) | set(pgvector_missing))
    duplicates = (pg_rows - pg_distinct) + max(0, ts_total - len(all_ids))
    server_errors = sum(code >= 500 for code in statuses)
    ledger.record(
        Scenario(
            name="Braid SIGKILLed mid-write, restarted, unacknowledged batches retried",
            injected=1,
            load=f"{WRITERS} concurrent writers, batches of {BATCH} client-chosen ids, embedded by the service",
            requests=counts["requests"],
            errors=counts["connection_errors"] + sum(code >= 400 for code in statuses),
            server_errors=server_errors,
            writes_acked=len(acked_ids),
            writes_found=len(pg_ok & ts_ok),
            lost_writes=len(lost),
            duplicates=duplicates,
            recovery_s=round(recovery_s, 2),
            outcome=(
                f"seed {SEED}: killed after {len(acked)} acknowledged batches; {len(unacked)} batches "
                f"unacknowledged ({len(committed_unacked)} had committed, {len(half_written)} half-written); "
                f"restart to healthy {recovery_s:.1f} s ({restart_to_healthy_after_kill:.1f} s after the kill), "
                f"{pending_at_kill} outbox rows pending at the kill, drained {drain_s:.1f} s after healthy; after the retry Postgres {pg_rows} rows / "
                f"Typesense {ts_total} documents for {len(all_ids)} ids"
            ),
        )
    )
    assert server_errors == 0, (statuses, service.output(1)[-3000:])
    assert len(acked) >= kill_after
    assert unacked, "the kill should have cut at least one batch"
    assert half_written == []
    assert lost == [], f"acknowledged writes missing: {lost[:10]}"
    assert (pg_rows, pg_distinct) == (len(all_ids), len(all_ids))
    assert ts_total == len(all_ids)
    assert set(ts_after) == set(all_ids)
    assert all(ts_after[mid]["content"] == contents[mid] for mid in all_ids)
    assert recovery_s < 120


# --- SIGKILL mid-reindex -------------------------------------------------------

KNOWN = {
    "known-lighthouse": "The lighthouse keeper's cat is called Marmalade",
    "known-violin": "Priya restores antique violins in her workshop on Tuesdays",
    "known-glacier": "The expedition crossed the Vatnajokull glacier on skis",
}
#: About 10 s of reindex on a loaded 2-core machine (6000: 27 s).
CORPUS = int(os.environ.get("BRAID_CRASH_REINDEX_CORPUS", "2000"))
WRITE_BATCH = 250


def unit_vector(rng: random.Random, dim: int = 384) -> list[float]:
    v = [rng.gauss(0.0, 1.0) for _ in range(dim)]
    norm = math.sqrt(sum(x * x for x in v))
    return [round(x / norm, 5) for x in v]


async def job(client: httpx.AsyncClient, svc: ServiceProcess, job_id: str) -> dict[str, Any]:
    r = await client.get(f"/admin/reindex/{job_id}", headers=svc.auth(ADMIN_KEY))
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


async def recall_known(client: httpx.AsyncClient, svc: ServiceProcess) -> dict[str, list[str]]:
    """What a Typesense-only recall answers for each known memory (top 3 ids)."""
    answers = {}
    for mid, text in KNOWN.items():
        r = await client.post(
            "/v1/recall", json={"query": text, "sources": ["typesense"], "top_k": 3}, headers=svc.auth()
        )
        assert r.status_code == 200, r.text
        assert r.json()["degraded"] == [], r.json()["sources"]
        answers[mid] = [i["id"] for i in r.json()["items"]]
    return answers


@pytest.mark.faults
async def test_sigkill_mid_reindex_old_index_serves_and_new_reindex_completes(
    service: ServiceProcess, ledger: Ledger
) -> None:
    rng = random.Random(SEED)
    requests = 0
    service.start()
    service.wait_healthy()
    async with service.client() as client:
        r = await client.post(
            "/v1/memories",
            json={"memories": [{"id": k, "content": v} for k, v in KNOWN.items()]},
            headers=service.auth(),
        )
        requests += 1
        assert r.status_code == 201, r.text
        write_started = time.monotonic()
        for start in range(0, CORPUS, WRITE_BATCH):
            body = [
                {"id": f"c{i}", "content": sentence(rng, f"c{i}"), "embedding": unit_vector(rng)}
                for i in range(start, min(start + WRITE_BATCH, CORPUS))
            ]
            r = await client.post("/v1/memories", json={"memories": body}, headers=service.auth())
            requests += 1
            assert r.status_code == 201, r.text
        await outbox_drained(service, timeout=300)
        write_s = time.monotonic() - write_started
        total = CORPUS + len(KNOWN)
        assert await typesense_count(service) == total
        old_collection = await alias_target(service)
        before = await recall_known(client, service)
        requests += len(KNOWN)
        assert {mid: ids[0] for mid, ids in before.items()} == {mid: mid for mid in KNOWN}

        r = await client.post("/admin/reindex", json={"target": "typesense"}, headers=service.auth(ADMIN_KEY))
        requests += 1
        assert r.status_code == 202, r.text
        killed_job = r.json()["job_id"]
        started = time.monotonic()
        while True:
            state = await job(client, service, killed_job)
            requests += 1
            ts = state["progress"].get("typesense", {})
            if ts.get("total") and ts.get("done", 0) >= ts["total"] // 3:
                break
            assert state["status"] in ("queued", "running"), state
            assert time.monotonic() - started < 300, state
            await anyio.sleep(0.02)
    service.sigkill()
    killed_at = time.monotonic()
    killed_after_s = killed_at - started
    (half_built,) = ts["collections"].values()
    copied_at_kill = ts["done"]
    phase_at_kill = ts["phase"]
    left_before_restart = await collections(service)

    service.start()
    recovery_s = service.wait_healthy()
    left_after_restart = await collections(service)
    async with service.client() as client:
        after_restart = await recall_known(client, service)
        requests += len(KNOWN)
        interrupted = await job(client, service, killed_job)
        requests += 1
        alias_after_restart = await alias_target(service)

        r = await client.post("/admin/reindex", json={"target": "typesense"}, headers=service.auth(ADMIN_KEY))
        requests += 1
        assert r.status_code == 202, r.text
        new_job = r.json()["job_id"]
        reindex_started = time.monotonic()
        while True:
            done = await job(client, service, new_job)
            requests += 1
            if done["status"] not in ("queued", "running"):
                break
            assert time.monotonic() - reindex_started < 300, done
            await anyio.sleep(0.2)
        reindex_s = time.monotonic() - reindex_started
        after_reindex = await recall_known(client, service)
        requests += len(KNOWN)
    final_collections = await collections(service)
    final_count = await typesense_count(service)

    ledger.record(
        Scenario(
            name="Braid SIGKILLed half-way through a Typesense reindex, restarted, reindexed again",
            injected=1,
            load=(
                f"{total} memories (written and synced in {write_s:.1f} s); reindex killed "
                f"{killed_after_s:.1f} s in ({phase_at_kill}), after copying {copied_at_kill} of them"
            ),
            requests=requests,
            writes_acked=total,
            writes_found=final_count,
            lost_writes=total - final_count,
            recovery_s=round(recovery_s, 2),
            outcome=(
                f"old job {interrupted['status']}; collections of the alias before the restart "
                f"{len(left_before_restart)}, after it {len(left_after_restart)}, after the new reindex "
                f"{len(final_collections)}; recalls from the old index answered after the restart; "
                f"new reindex {done['status']} in {reindex_s:.1f} s "
                f"({time.monotonic() - killed_at:.1f} s from the kill)"
            ),
        )
    )
    # The kill left the half-built collection; the restart dropped it and kept the old one.
    assert state["status"] == "running" and phase_at_kill in ("copying", "replaying"), state
    pair = {old_collection, f"{old_collection}_vectors"}
    assert left_before_restart == pair | {half_built, f"{half_built}_vectors"}
    assert half_built != old_collection
    assert left_after_restart == pair
    assert alias_after_restart == old_collection
    assert after_restart == before
    assert interrupted["status"] == "interrupted"
    assert interrupted["error"] == "the service stopped while the job ran"
    assert interrupted["finished_at"] is not None
    # A new reindex completes and switches to a collection of its own.
    assert done["status"] == "done", done
    assert done["progress"]["typesense"]["phase"] == "switched"
    assert done["progress"]["typesense"]["previous"] == {service.alias: old_collection}
    (new_collection,) = done["progress"]["typesense"]["collections"].values()
    assert final_collections == {new_collection, f"{new_collection}_vectors"}
    assert await alias_target(service) == new_collection
    assert final_count == total
    assert after_reindex == before


# --- what a dead job leaves, cleared (indexers/reindex.py) -------------------------


async def add_job(dsn: str, job_id: str, status: str, progress: dict[str, Any]) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO reindex_jobs (id, target, status, progress) VALUES (%s, 'typesense', %s, %s)",
            (job_id, status, Jsonb(progress)),
        )


async def test_start_up_finishes_a_reindex_that_died_after_switching_the_alias(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any
) -> None:
    app, dsn, alias = make_app(postgres, typesense, embedder)
    async with serve(app) as client:
        braid = Braid(client=client, app=app, dsn=dsn, alias=alias)
        rt = braid.runtime
        early = await braid.remember({"content": "The ferry leaves Oban at noon"})
        await braid.synced()
        index = rt.index.of(TENANT)
        old = await index.current_collection()
        # A job that died between switching the alias and its second replay:
        # the new collection misses a write that reached the old one late.
        new = await index.new_collection()
        await rt.sync.apply([(TENANT, early[0])], collections={index.alias: new})
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            cur = await conn.execute("SELECT clock_timestamp() - interval '1 second'")
            (since,) = await cur.fetchone()  # type: ignore[misc]
        late = await braid.remember({"content": "The harbour master is called Fergus"})
        await braid.synced()
        assert await index.fetch(late[0], tenant=TENANT, collection=new) is None
        assert await index.switch_alias(new) == old
        # ... and before the vectors alias, switched second, followed.
        await rt.typesense.upsert_alias(index.vectors_alias, f"{old}_vectors")
        progress = {"collection": new, "previous": old, "since": since.isoformat(), "phase": "replaying"}
        await add_job(dsn, "died-after-switch", "running", {"typesense": progress})

        assert await rt.jobs.mark_interrupted() == 1  # what start-up runs

        assert await index.current_collection() == new
        assert await rt.index.fetch(late[0], tenant=TENANT) is not None
        assert await rt.typesense.get_alias(index.vectors_alias) == f"{new}_vectors"
        assert await rt.index.fetch_vector(late[0], tenant=TENANT) is not None
        assert await rt.typesense.get_collection(old) is None
        assert await rt.typesense.get_collection(f"{old}_vectors") is None
        job = await rt.jobs.get("died-after-switch")
        assert job is not None and job["status"] == "interrupted"
        assert job["progress"]["typesense"] == {**progress, "cleared": True}
        assert await rt.jobs.clear_leftovers() == []  # done once
        out = await braid.recall("who is the harbour master", sources=["typesense"])
        assert out["degraded"] == [] and out["items"][0]["id"] == late[0]


async def test_next_reindex_drops_the_collection_of_a_failed_job(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any
) -> None:
    app, dsn, alias = make_app(postgres, typesense, embedder)
    async with serve(app) as client:
        braid = Braid(client=client, app=app, dsn=dsn, alias=alias)
        rt = braid.runtime
        ids = await braid.remember({"content": "Nadia keeps bees"}, {"content": "Tomas plays the oboe"})
        await braid.synced()
        index = rt.index.of(TENANT)
        old = await index.current_collection()
        leftover = await index.new_collection()
        await add_job(
            dsn,
            "failed-mid-copy",
            "failed",
            {
                "typesense": {
                    "collections": {index.alias: leftover},
                    "previous": {index.alias: old},
                    "phase": "copying",
                    "done": 0,
                }
            },
        )

        r = await braid.post("/admin/reindex", {"target": "typesense"}, key=ADMIN_A)
        assert r.status_code == 202, r.text
        with anyio.fail_after(60):
            while (job := await rt.jobs.get(r.json()["job_id"])) is not None and job["status"] in ("queued", "running"):
                await anyio.sleep(0.1)
        assert job is not None and job["status"] == "done", job
        assert job["progress"]["typesense"]["previous"] == {index.alias: old}
        rebuilt = job["progress"]["typesense"]["collections"][index.alias]
        assert await index.current_collection() == rebuilt
        for gone in (leftover, old):
            assert await rt.typesense.get_collection(gone) is None
            assert await rt.typesense.get_collection(f"{gone}_vectors") is None
        assert await rt.index.count(tenant=TENANT) == len(ids)
        failed = await rt.jobs.get("failed-mid-copy")
        assert failed is not None and failed["progress"]["typesense"]["cleared"] is True
