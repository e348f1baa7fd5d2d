"""A large tenant moved to a Typesense collection pair of its own, online
(the ``placement`` admin job, ``indexers/placement.py``), against the real
Postgres and Typesense."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import msgspec
import psycopg
import pytest

from config import BraidConfig
from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense
from indexers.base import SearchQuery, SourceUnavailable
from indexers.own_index import own_index_name
from indexers.typesense.documents import NEVER, tenant_key
from indexers.typesense.placement import own_alias

from . import conftest
from .conftest import ADMIN_A, AGENT_B, AGENT_FOLDED, Braid, make_app, patient, serve
from .test_admin import wait_job

pytestmark = pytest.mark.anyio

#: The documents of tenant-a, and of Tenant_A (which `tenant:=` would not tell apart).
A = f"tenant_key:={tenant_key('tenant-a')}"
FOLDED = f"tenant_key:={tenant_key('Tenant_A')}"


def placing(alias: str, above: int) -> BraidConfig:
    cfg = patient(conftest.test_config(alias))
    return msgspec.structs.replace(cfg, typesense=msgspec.structs.replace(cfg.typesense, own_collection_above=above))


@asynccontextmanager
async def placing_braid(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any, above: int, **typesense_source: Any
) -> AsyncIterator[Braid]:
    """A Braid on a fresh database and alias whose placement job moves
    tenants of ``above`` memories (``typesense_source``: changes to
    ``sources.typesense``)."""
    alias = f"mem_{uuid.uuid4().hex[:10]}"
    cfg = placing(alias, above)
    if typesense_source:
        cfg = cfg.with_source("typesense", **typesense_source)
    app, dsn, _ = make_app(postgres, typesense, embedder, cfg, alias=alias)
    async with serve(app) as client:
        yield Braid(client=client, app=app, dsn=dsn, alias=alias)


def record_searches(client: Any) -> list[list[dict[str, Any]]]:
    """Every batch of searches ``client.multi_search`` sends from now on, in order."""
    batches: list[list[dict[str, Any]]] = []
    inner = client.multi_search

    async def recording(searches: Any) -> Any:
        batches.append(list(searches))
        return await inner(searches)

    client.multi_search = recording
    return batches


async def placements(dsn: str) -> list[tuple[str, str, str]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute("SELECT tenant, alias, state FROM typesense_placements ORDER BY tenant")
        return [(r[0], r[1], r[2]) for r in await cur.fetchall()]


async def test_a_large_tenant_moves_to_its_own_collection_while_it_recalls_and_writes(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any
) -> None:
    async with placing_braid(postgres, typesense, embedder, 20) as braid:
        alias, dsn = braid.alias, braid.dsn
        own = own_alias(alias, "tenant-a")
        rt, ts = braid.runtime, braid.runtime.typesense
        big = await braid.remember(*({"content": f"Aiko's logbook entry {n}: sailed to island {n}"} for n in range(30)))
        [anchor] = await braid.remember({"content": "Aiko keeps the ship's cat, Miso, in the galley"})
        small = await braid.remember(*({"content": f"Bruno fixed bicycle {n}"} for n in range(5)), key=AGENT_B)
        # A small tenant whose name Typesense's filters fold into tenant-a's stays.
        folded = await braid.remember(*({"content": f"Carla fed cat {n}"} for n in range(3)), key=AGENT_FOLDED)
        await braid.synced()
        assert await ts.count(alias) == 39

        problems: list[str] = []
        recalls = 0
        written: list[str] = []
        stop = anyio.Event()

        async def recall_loop() -> None:
            nonlocal recalls
            while not stop.is_set():
                r = await braid.post("/v1/recall", {"query": "the ship's cat Miso", "sources": ["typesense"]})
                recalls += 1
                if r.status_code != 200 or r.json()["degraded"]:
                    problems.append(r.text)
                elif anchor not in [i["id"] for i in r.json()["items"]]:
                    problems.append(f"anchor missing: {r.json()['items']}")
                await anyio.sleep(0.02)

        async def write_loop() -> None:
            n = 0
            while not stop.is_set():
                written.extend(await braid.remember({"content": f"Aiko wrote harbour note {n} during the move"}))
                n += 1
                await anyio.sleep(0.2)

        async with anyio.create_task_group() as tg:
            tg.start_soon(recall_loop)
            tg.start_soon(write_loop)
            r = await braid.post("/admin/reindex", {"target": "placement"}, key=ADMIN_A)
            assert r.status_code == 202, r.text
            job = await wait_job(braid, r.json()["job_id"])
            stop.set()

        assert job["status"] == "done", job
        progress = job["progress"]["placement"]
        assert progress["tenants"] == ["tenant-a"] and progress["done"] == progress["total"] == 1
        assert progress["threshold"] == 20
        assert progress["current"]["tenant"] == "tenant-a" and progress["current"]["alias"] == own
        assert progress["current"]["phase"] == "moved"
        assert progress["current"]["done"] >= 31
        assert problems == [] and recalls > 10 and len(written) > 10

        await braid.synced()
        assert await placements(dsn) == [("tenant-a", own, "live")]
        assert rt.index.alias_of("tenant-a") == own and rt.index.alias_of("tenant-b") == alias
        # Every memory of tenant-a, those written during the move too, is in
        # its own pair; none is left in the shared one, where tenant-b stays.
        total_a = len(big) + 1 + len(written)
        assert await ts.count(own) == total_a
        assert await ts.count(f"{own}_vectors") == total_a
        assert await ts.count(alias, A) == 0
        assert await ts.count(f"{alias}_vectors", A) == 0
        assert await ts.count(alias, "tenant:=`tenant-b`") == len(small)
        assert await ts.count(alias, FOLDED) == await ts.count(f"{alias}_vectors", FOLDED) == len(folded)
        out = await braid.recall("harbour note 3 during the move", sources=["typesense"])
        assert written[3] in [i["id"] for i in out["items"]]
        out = await braid.recall("fixed bicycle", key=AGENT_B, top_k=10, sources=["typesense"])
        assert sorted(i["id"] for i in out["items"]) == sorted(small)

        # Writes now go to the tenant's own pair only.
        [late] = await braid.remember({"content": "Aiko's cat Miso learned to open the galley door"})
        await braid.synced()
        assert await rt.index.fetch(late, tenant="tenant-a") is not None
        assert await ts.count(alias, A) == 0

        # Nothing is left to move; a Typesense reindex rebuilds the tenant's pair too.
        r = await braid.post("/admin/reindex", {"target": "placement"}, key=ADMIN_A)
        again = await wait_job(braid, r.json()["job_id"])
        assert again["status"] == "done" and again["progress"]["placement"]["total"] == 0
        before = await ts.get_alias(own)
        r = await braid.post("/admin/reindex", {"target": "typesense"}, key=ADMIN_A)
        rebuilt = await wait_job(braid, r.json()["job_id"])
        assert rebuilt["status"] == "done", rebuilt
        assert sorted(rebuilt["progress"]["typesense"]["collections"]) == sorted([alias, own])
        assert await ts.get_alias(own) != before
        assert await ts.count(own) == total_a + 1
        assert await ts.count(alias) == len(small) + len(folded)


async def test_a_tenant_in_a_pair_of_its_own_is_searched_without_its_key_and_gets_no_superseded_memory(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any
) -> None:
    """In its own pair every document is the tenant's, so its searches leave
    ``current_key`` out of the filter (it cost two thirds of a search at
    800k documents) and the source checks it on the hits: a superseded
    memory, which the filter no longer keeps out, never comes back, and
    ``as_of`` still finds it."""

    def stamp(**ago: float) -> str:  # recent: the session tier forgets old memories
        return (datetime.now(UTC) - timedelta(**ago)).isoformat()

    async with placing_braid(postgres, typesense, embedder, 10) as braid:
        own = own_alias(braid.alias, "tenant-a")
        await braid.remember(*({"content": f"Aiko's logbook entry {n}: sailed to island {n}"} for n in range(12)))
        port = {"mem_key": "aiko.port", "confidence": 0.9}
        [old] = await braid.remember({**port, "content": "Aiko's home port is Lisbon", "created_at": stamp(days=2)})
        [new] = await braid.remember({**port, "content": "Aiko's home port is Porto", "created_at": stamp(hours=1)})
        await braid.remember(*({"content": f"Bruno's home port is Bergen, pier {n}"} for n in range(3)), key=AGENT_B)
        r = await braid.post("/admin/reindex", {"target": "placement"}, key=ADMIN_A)
        assert r.status_code == 202, r.text
        job = await wait_job(braid, r.json()["job_id"])
        assert job["status"] == "done", job
        await braid.synced()
        assert braid.runtime.index.alias_of("tenant-a") == own
        # The superseded memory's documents are in the pair, for as_of.
        assert await braid.runtime.typesense.count(own, f"superseded_at:<{NEVER}") == 1

        batches = record_searches(braid.runtime.typesense)
        out = await braid.recall("home port", sources=["typesense"], top_k=5)
        ids = [i["id"] for i in out["items"]]
        assert new in ids and old not in ids, out["items"]
        sent = [s for batch in batches for s in batch]
        assert {s["collection"] for s in sent} == {own, f"{own}_vectors"}
        assert all("current_key" not in s.get("filter_by", "") for s in sent), sent
        # The source's own answer, before the engine checks it against Postgres.
        source = braid.runtime.engine.sources["typesense"]
        hits = await source.search(SearchQuery(tenant="tenant-a", text="home port", vector=None, limit=20))
        assert new in [h.id for h in hits] and old not in [h.id for h in hits], hits

        batches.clear()
        out = await braid.recall("home port", sources=["typesense"], top_k=5, as_of=stamp(days=1))
        ids = [i["id"] for i in out["items"]]
        assert old in ids and new not in ids, out["items"]
        sent = [s for batch in batches for s in batch]
        assert sent and all(A in s["filter_by"] for s in sent), sent

        # A tenant sharing its group's pair is still narrowed by its key.
        batches.clear()
        out = await braid.recall("home port", key=AGENT_B, sources=["typesense"], top_k=5)
        assert len(out["items"]) == 3
        sent = [s for batch in batches for s in batch]
        b = f"current_key:={tenant_key('tenant-b')}"
        assert sent and all(b in s["filter_by"] for s in sent), sent


async def test_a_tenant_whose_superseded_documents_fill_its_candidates_is_searched_with_its_key_again(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any
) -> None:
    """Without the tenant clause, superseded documents (kept for ``as_of``)
    can take the candidate slots: when they fill more than
    SUPERSEDED_SHARE of a full page, the search is sent again naming
    ``current_key``, and so are the tenant's next searches."""
    async with placing_braid(postgres, typesense, embedder, 10, bm25_candidates=10) as braid:
        own = own_alias(braid.alias, "tenant-a")
        # The old values are shorter: the candidate search (length ascending) meets them first.
        await braid.remember(*({"content": f"Port log {n}: Lisbon", "mem_key": f"log.{n}"} for n in range(20)))
        new = await braid.remember(
            *(
                {"content": f"Port log {n}: the boat moved on to Porto harbour", "mem_key": f"log.{n}"}
                for n in range(20)
            )
        )
        r = await braid.post("/admin/reindex", {"target": "placement"}, key=ADMIN_A)
        assert r.status_code == 202, r.text
        assert (await wait_job(braid, r.json()["job_id"]))["status"] == "done"
        await braid.synced()
        assert braid.runtime.index.alias_of("tenant-a") == own
        assert await braid.runtime.typesense.count(own, f"superseded_at:<{NEVER}") == 20

        batches = record_searches(braid.runtime.typesense)
        source = braid.runtime.engine.sources["typesense"]
        query = SearchQuery(tenant="tenant-a", text="port log", vector=None, limit=10)
        hits = await source.search(query)
        assert len(hits) == 10 and {h.id for h in hits} <= set(new), hits
        key = f"current_key:={tenant_key('tenant-a')}"
        assert not any(key in s.get("filter_by", "") for s in batches[0]), batches
        assert all(key in s.get("filter_by", "") for s in batches[-1]), batches
        batches.clear()
        again = await source.search(query)
        assert [h.id for h in again] == [h.id for h in hits]
        assert batches and all(key in s.get("filter_by", "") for batch in batches for s in batch), batches


async def test_a_placement_job_with_a_tier_is_refused(braid: Braid) -> None:
    r = await braid.post("/admin/reindex", {"target": "placement", "tier": "session"}, key=ADMIN_A)
    assert r.status_code == 400
    assert r.json()["detail"] == "tier applies to pgvector indexes; a placement job moves tenants in Typesense"


async def test_a_move_that_fails_mid_copy_is_reported_and_the_next_job_finishes_it(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any
) -> None:
    async with placing_braid(postgres, typesense, embedder, 5) as braid:
        alias, dsn = braid.alias, braid.dsn
        own = own_alias(alias, "tenant-a")
        rt = braid.runtime
        ids = await braid.remember(*({"content": f"Aiko's recipe {n}: miso soup"} for n in range(8)))
        await braid.synced()

        # The fault: Typesense refuses the copy's imports into the tenant's pair.
        inner = rt.index.upsert

        async def refusing(records: Any, collections: Any = None, **kw: Any) -> None:
            if collections is not None and own in collections:
                raise SourceUnavailable("typesense", "injected: import refused")
            await inner(records, collections, **kw)

        rt.index.upsert = refusing  # type: ignore[method-assign]
        r = await braid.post("/admin/reindex", {"target": "placement"}, key=ADMIN_A)
        failed = await wait_job(braid, r.json()["job_id"])
        assert failed["status"] == "failed" and "injected: import refused" in failed["error"], failed
        assert failed["progress"]["placement"]["current"]["phase"] == "copying"
        # Cut short: still `copying`, so searches read the group, which holds everything.
        assert await placements(dsn) == [("tenant-a", own, "copying")]
        out = await braid.recall("miso soup recipe", top_k=8, sources=["typesense"])
        assert sorted(i["id"] for i in out["items"]) == sorted(ids)

        rt.index.upsert = inner  # type: ignore[method-assign]
        r = await braid.post("/admin/reindex", {"target": "placement"}, key=ADMIN_A)
        done = await wait_job(braid, r.json()["job_id"])
        assert done["status"] == "done" and done["progress"]["placement"]["tenants"] == ["tenant-a"], done
        assert await placements(dsn) == [("tenant-a", own, "live")]
        assert await rt.typesense.count(own) == len(ids)
        assert await rt.typesense.count(alias, A) == 0
        out = await braid.recall("miso soup recipe", top_k=8, sources=["typesense"])
        assert sorted(i["id"] for i in out["items"]) == sorted(ids)


async def test_a_move_that_fails_clearing_its_group_is_cleared_by_the_next_job(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any
) -> None:
    async with placing_braid(postgres, typesense, embedder, 5) as braid:
        alias, dsn = braid.alias, braid.dsn
        own = own_alias(alias, "tenant-a")
        ts = braid.runtime.typesense
        ids = await braid.remember(*({"content": f"Aiko's kite number {n} is red"} for n in range(6)))
        await braid.synced()
        vectors = await ts.get_alias(f"{alias}_vectors")

        # The fault: deletes from the group's vectors collection time out.
        inner = ts.delete_documents

        async def timing_out(collection: str, doc_ids: Any) -> int:
            if collection == vectors:
                raise SourceUnavailable("typesense", "injected: timed out")
            return await inner(collection, doc_ids)

        ts.delete_documents = timing_out  # type: ignore[method-assign]
        r = await braid.post("/admin/reindex", {"target": "placement"}, key=ADMIN_A)
        failed = await wait_job(braid, r.json()["job_id"])
        assert failed["status"] == "failed" and "injected: timed out" in failed["error"], failed
        # Live already: searches read the tenant's pair; its group still holds its vectors.
        assert await placements(dsn) == [("tenant-a", own, "live")]
        assert await ts.count(f"{alias}_vectors", A) == len(ids)
        out = await braid.recall("red kites", top_k=6, sources=["typesense"])
        assert sorted(i["id"] for i in out["items"]) == sorted(ids)

        ts.delete_documents = inner  # type: ignore[method-assign]
        r = await braid.post("/admin/reindex", {"target": "placement"}, key=ADMIN_A)
        done = await wait_job(braid, r.json()["job_id"])
        assert done["status"] == "done", done
        assert done["progress"]["placement"]["total"] == 0
        assert done["progress"]["placement"]["cleared"] == {"tenant-a": len(ids)}
        assert await ts.count(f"{alias}_vectors", A) == 0
        assert await ts.count(alias, A) == 0
        assert await ts.count(own) == len(ids)


async def index_scans(dsn: str, name: str) -> int:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT coalesce(sum(idx_scan), 0) FROM pg_stat_user_indexes WHERE indexrelname = %s", (name,)
        )
        row = await cur.fetchone()
        return int(row[0]) if row else 0


def own_indexing(alias: str) -> BraidConfig:
    """A config whose placement job moves no tenant in Typesense, and whose
    session tier walks its index from 10 rows on: a tenant of 20 gets one of its own."""
    cfg = placing(alias, 10**6)
    session = msgspec.structs.replace(cfg.tiers["session"], exact_below=10)
    return msgspec.structs.replace(
        cfg,
        tiers={**cfg.tiers, "session": session},
        postgres=msgspec.structs.replace(cfg.postgres, own_index_above=20),
    )


async def test_a_placement_job_gives_a_large_tenant_its_own_hnsw_index_which_its_recalls_walk(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any
) -> None:
    alias = f"mem_{uuid.uuid4().hex[:10]}"
    cfg = own_indexing(alias)
    app, dsn, _ = make_app(postgres, typesense, embedder, cfg, alias=alias)
    async with serve(app) as client:
        braid = Braid(client=client, app=app, dsn=dsn, alias=alias)
        ids = await braid.remember(*({"content": f"Aiko's logbook entry {n}: sailed to island {n}"} for n in range(29)))
        [anchor] = await braid.remember({"content": "Aiko keeps the ship's cat, Miso, in the galley"})
        await braid.remember(*({"content": f"Bruno fixed bicycle {n}"} for n in range(5)), key=AGENT_B)

        r = await braid.post("/admin/reindex", {"target": "placement"}, key=ADMIN_A)
        assert r.status_code == 202, r.text
        job = await wait_job(braid, r.json()["job_id"])
        assert job["status"] == "done", job
        assert job["progress"]["pgvector"] == {
            "threshold": 20,
            "indexes": [{"tenant": "tenant-a", "tier": "session", "memories": 30}],
            "done": 1,
            "total": 1,
            "over_cap": [],
            "dropped": [],
        }
        assert job["progress"]["placement"]["total"] == 0
        name = own_index_name("session", "tenant-a")
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            cur = await conn.execute("SELECT tenant, tier, name FROM pgvector_own_indexes")
            assert await cur.fetchall() == [("tenant-a", "session", name)]

        # Within the sources' refresh (10 s) the tenant's recalls walk its own
        # index (Postgres' scan counter grows), and find what they found before.
        with anyio.fail_after(60):
            while await index_scans(dsn, name) == 0:
                out = await braid.recall("the ship's cat Miso", sources=["pgvector"], top_k=5)
                assert out["items"][0]["id"] == anchor and not out["degraded"]
                await anyio.sleep(0.5)
        out = await braid.recall("sailed to island", sources=["pgvector"], top_k=10)
        assert {i["id"] for i in out["items"]} <= set(ids) | {anchor} and len(out["items"]) == 10
        # The other tenant has none of its own; its recall is untouched.
        out = await braid.recall("fixed bicycle", key=AGENT_B, top_k=10, sources=["pgvector"])
        assert len(out["items"]) == 5


async def own_rows(dsn: str, tenant: str) -> tuple[int, int]:
    """``tenant``'s memories flagged ``own`` and not."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FILTER (WHERE own), count(*) FILTER (WHERE NOT own) FROM memories WHERE tenant = %s",
            (tenant,),
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row[0]), int(row[1])


async def test_an_import_job_keeps_a_tenants_load_out_of_every_hnsw_index_until_placement_builds_its_own(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any
) -> None:
    """``import``: the tenant's own indexes are reserved (recorded, not
    built) and it moves to a Typesense pair of its own before its load;
    every row it writes is flagged ``own`` (in no shared graph) and still
    found, exactly; the next placement job builds the indexes in one pass."""
    alias = f"mem_{uuid.uuid4().hex[:10]}"
    cfg = own_indexing(alias)  # only the import moves a tenant in Typesense
    app, dsn, _ = make_app(postgres, typesense, embedder, cfg, alias=alias)
    async with serve(app) as client:
        braid = Braid(client=client, app=app, dsn=dsn, alias=alias)
        before = await braid.remember(*({"content": f"Aiko's early log {n}: left harbour {n}"} for n in range(12)))
        assert (await own_rows(dsn, "tenant-a"))[1] > 0  # past exactBelow: in the shared index

        r = await braid.post("/admin/reindex", {"target": "import", "tenant": "tenant-a"}, key=ADMIN_A)
        assert r.status_code == 202, r.text
        job = await wait_job(braid, r.json()["job_id"])
        assert job["status"] == "done", job
        done = job["progress"]["import"]
        assert set(job["progress"]["compact"]["nodes"].values()) == {"ok"}, job
        own = own_alias(alias, "tenant-a")
        assert done["tenant"] == "tenant-a" and done["phase"] == "importing"
        assert sorted(done["reserved"]) == sorted(cfg.memory_tiers)
        assert done["typesense"]["alias"] == own and done["typesense"]["phase"] == "moved"
        assert await placements(dsn) == [("tenant-a", own, "live")]
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            cur = await conn.execute("SELECT tier, name, to_regclass(name) FROM pgvector_own_indexes ORDER BY tier")
            assert await cur.fetchall() == sorted((t, own_index_name(t, "tenant-a"), None) for t in cfg.memory_tiers)
        assert await own_rows(dsn, "tenant-a") == (len(before), 0)

        # The load: every row flagged, none in a shared graph, all found.
        ids = await braid.remember(*({"content": f"Aiko's logbook entry {n}: sailed to island {n}"} for n in range(20)))
        [anchor] = await braid.remember({"content": "Aiko keeps the ship's cat, Miso, in the galley"})
        b = await braid.remember(*({"content": f"Bruno fixed bicycle {n}"} for n in range(15)), key=AGENT_B)
        assert await own_rows(dsn, "tenant-a") == (len(before) + len(ids) + 1, 0)
        assert (await own_rows(dsn, "tenant-b"))[1] > 0  # another tenant's rows go on into the shared graph
        out = await braid.recall("the ship's cat Miso", sources=["pgvector"], top_k=5)
        assert out["items"][0]["id"] == anchor and not out["degraded"]
        out = await braid.recall("sailed to island", sources=["pgvector"], top_k=10)
        assert {i["id"] for i in out["items"]} <= set(ids) | set(before) | {anchor} and len(out["items"]) == 10
        await braid.synced()
        assert await braid.runtime.typesense.count(own) == len(before) + len(ids) + 1
        assert await braid.runtime.typesense.count(alias, A) == 0
        out = await braid.recall("the ship's cat Miso", sources=["typesense"], top_k=5)
        assert out["items"][0]["id"] == anchor

        r = await braid.post("/admin/reindex", {"target": "placement"}, key=ADMIN_A)
        job = await wait_job(braid, r.json()["job_id"])
        assert job["status"] == "done", job
        assert job["progress"]["compact"]["phase"] == "done", job
        session_rows = len(before) + len(ids) + 1
        # The session tier's reservation is built; the rag tier's (no rows) is dropped.
        assert job["progress"]["pgvector"]["indexes"] == [
            {"tenant": "tenant-a", "tier": "session", "memories": session_rows}
        ]
        assert job["progress"]["pgvector"]["dropped"] == [
            {"tenant": "tenant-a", "tier": t} for t in sorted(cfg.memory_tiers) if t != "session"
        ]
        name = own_index_name("session", "tenant-a")
        with anyio.fail_after(60):
            while await index_scans(dsn, name) == 0:
                out = await braid.recall("the ship's cat Miso", sources=["pgvector"], top_k=5)
                assert out["items"][0]["id"] == anchor and not out["degraded"]
                await anyio.sleep(0.5)
        assert await own_rows(dsn, "tenant-a") == (session_rows, 0)
        out = await braid.recall("fixed bicycle", key=AGENT_B, top_k=20, sources=["pgvector"])
        assert sorted(i["id"] for i in out["items"]) == sorted(b)


async def test_an_import_that_would_pass_the_own_index_cap_reserves_nothing(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any
) -> None:
    alias = f"mem_{uuid.uuid4().hex[:10]}"
    cfg = placing(alias, 10**6)
    cfg = msgspec.structs.replace(
        cfg, postgres=msgspec.structs.replace(cfg.postgres, own_index_above=20, own_indexes_max=1)
    )
    assert len(cfg.memory_tiers) > 1
    app, dsn, _ = make_app(postgres, typesense, embedder, cfg, alias=alias)
    async with serve(app) as client:
        braid = Braid(client=client, app=app, dsn=dsn, alias=alias)
        r = await braid.post("/admin/reindex", {"target": "import", "tenant": "tenant-a"}, key=ADMIN_A)
        job = await wait_job(braid, r.json()["job_id"])
        assert job["status"] == "failed"
        assert "would pass postgres.ownIndexesMax (1; 0 recorded)" in job["error"], job
        assert await placements(dsn) == []
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            cur = await conn.execute("SELECT count(*) FROM pgvector_own_indexes")
            assert await cur.fetchone() == (0,)


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ({"target": "import"}, "target import needs `tenant`: the tenant about to be bulk loaded"),
        (
            {"target": "import", "tenant": "tenant-a", "tier": "session"},
            "tier applies to pgvector indexes; an import job prepares every tier of its tenant",
        ),
        ({"target": "placement", "tenant": "tenant-a"}, "tenant applies to target import only, not placement"),
    ],
)
async def test_an_import_job_without_its_tenant_or_with_a_tier_is_refused(
    braid: Braid, body: dict[str, Any], detail: str
) -> None:
    r = await braid.post("/admin/reindex", body, key=ADMIN_A)
    assert r.status_code == 400
    assert r.json()["detail"] == detail


async def test_an_import_job_for_a_malformed_tenant_is_refused(braid: Braid) -> None:
    r = await braid.post("/admin/reindex", {"target": "import", "tenant": "no spaces; please"}, key=ADMIN_A)
    assert r.status_code == 400
    assert "tenant" in r.json()["detail"], r.text


async def test_an_import_job_is_refused_while_no_own_index_would_ever_be_built(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any
) -> None:
    alias = f"mem_{uuid.uuid4().hex[:10]}"
    cfg = placing(alias, 10**6)
    cfg = msgspec.structs.replace(cfg, postgres=msgspec.structs.replace(cfg.postgres, own_index_above=None))
    app, dsn, _ = make_app(postgres, typesense, embedder, cfg, alias=alias)
    async with serve(app) as client:
        braid = Braid(client=client, app=app, dsn=dsn, alias=alias)
        r = await braid.post("/admin/reindex", {"target": "import", "tenant": "tenant-a"}, key=ADMIN_A)
        assert r.status_code == 400
        assert "postgres.ownIndexAbove is null" in r.json()["detail"], r.text
