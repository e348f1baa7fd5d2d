"""Tenants spread over Typesense collection groups (``typesense.groups``),
through the API, against the real Postgres and Typesense."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import psycopg
import pytest

from config import BraidConfig, ConfigError, TypesenseClusterConfig
from config.loader import parse_config
from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense
from indexers.typesense import TypesenseClient
from indexers.typesense.documents import group_alias
from indexers.typesense.placement import own_alias

from . import conftest
from .conftest import ADMIN_A, AGENT_B, Braid, make_app, patient, serve
from .test_admin import wait_job

pytestmark = pytest.mark.anyio


def grouped(alias: str, groups: int) -> BraidConfig:
    cfg = patient(conftest.test_config(alias))
    return msgspec.structs.replace(cfg, typesense=msgspec.structs.replace(cfg.typesense, groups=groups))


async def jobs(dsn: str) -> list[tuple[str, str, dict[str, Any]]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute("SELECT id, status, progress FROM reindex_jobs ORDER BY created_at")
        return [(r[0], r[1], r[2]) for r in await cur.fetchall()]


async def test_each_tenant_is_written_to_and_searched_in_its_own_group(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any
) -> None:
    alias = f"mem_{uuid.uuid4().hex[:10]}"
    app, dsn, _ = make_app(postgres, typesense, embedder, grouped(alias, 3), alias=alias)
    # tenant-a hashes to group 1 of 3 and tenant-b to group 2 (tests/unit/test_typesense_groups.py).
    home_a, home_b, empty = f"{alias}_g1", f"{alias}_g2", f"{alias}_g0"
    async with serve(app) as client:
        braid = Braid(client=client, app=app, dsn=dsn, alias=alias)
        rt = braid.runtime
        assert rt.index.alias_of("tenant-a") == home_a
        assert rt.index.alias_of("tenant-b") == home_b
        [a] = await braid.remember({"content": "Aiko's cello lessons are on Thursdays"})
        [b1, b2] = await braid.remember(
            {"content": "Bruno repairs bicycles in Porto"}, {"content": "Bruno's cello is in the attic"}, key=AGENT_B
        )
        await braid.synced()

        ts = rt.typesense
        assert await ts.get_alias(alias) is None  # no ungrouped collection
        assert await ts.count(home_a) == 1
        assert await ts.count(home_b) == 2
        assert await ts.count(empty) == 0
        assert await ts.count(f"{home_b}_vectors") == 2
        assert await rt.index.count() == 3

        searched: list[str] = []
        inner = ts.multi_search

        async def recording(searches: Any) -> Any:
            searched.extend(s["collection"] for s in searches)
            return await inner(searches)

        ts.multi_search = recording  # type: ignore[method-assign]
        out = await braid.recall("cello lessons", sources=["typesense"])
        assert [i["id"] for i in out["items"]] == [a]
        assert set(searched) == {home_a, f"{home_a}_vectors"}
        searched.clear()
        out = await braid.recall("who has a cello", key=AGENT_B, sources=["typesense"])
        assert set(i["id"] for i in out["items"]) <= {b1, b2} and b2 in [i["id"] for i in out["items"]]
        assert set(searched) == {home_b, f"{home_b}_vectors"}

        # Ready only while every group's alias answers.
        assert await rt.index.ready() is True
        r = await client.get("/health")
        assert r.status_code == 200 and r.json()["backends"]["typesense"]["status"] == "up", r.text

        # A delete reaches the tenant's group.
        r = await client.delete(f"/v1/memories/{b1}", headers=braid.headers(AGENT_B))
        assert r.status_code == 200, r.text
        await braid.synced()
        assert await ts.count(home_b) == 1
        assert await rt.index.fetch(b1, tenant="tenant-b") is None

        target = await ts.get_alias(empty)
        assert target is not None and await ts.delete_alias(empty)
        assert await rt.index.ready() is False
        await ts.upsert_alias(empty, target)
        assert await rt.index.ready() is True


async def test_a_changed_group_count_is_filled_from_postgres_at_the_next_start(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any
) -> None:
    alias = f"mem_{uuid.uuid4().hex[:10]}"
    app, dsn, _ = make_app(postgres, typesense, embedder, grouped(alias, 1), alias=alias)
    async with serve(app) as client:
        braid = Braid(client=client, app=app, dsn=dsn, alias=alias)
        ids_a = await braid.remember(*({"content": f"Aiko planted {n} tulips"} for n in range(3)))
        ids_b = await braid.remember(*({"content": f"Bruno sold {n} bicycles"} for n in range(2)), key=AGENT_B)
        await braid.synced()
        before = await braid.runtime.index.of("tenant-a").current_collection()
        assert before is not None and await braid.runtime.typesense.count(alias) == 5
    assert await jobs(dsn) == []

    # Restarted with three groups: they are new and empty, so a reindex fills them.
    app, _, _ = make_app(postgres, typesense, embedder, grouped(alias, 3), dsn=dsn, alias=alias)
    async with serve(app) as client:
        braid = Braid(client=client, app=app, dsn=dsn, alias=alias)
        rt = braid.runtime
        with anyio.fail_after(60):
            while not (listed := await jobs(dsn)) or listed[-1][1] in ("queued", "running"):
                await anyio.sleep(0.05)
        [(_, status, progress)] = listed
        assert status == "done", progress
        ts = progress["typesense"]
        assert ts["phase"] == "switched" and ts["done"] == ts["total"] == 5
        assert ts["dropped"] == [alias]
        assert sorted(ts["collections"]) == [f"{alias}_g{i}" for i in range(3)]
        # The one-group layout is gone, aliases and collections.
        for gone in (alias, f"{alias}_vectors"):
            assert await rt.typesense.get_alias(gone) is None
        assert await rt.typesense.get_collection(before) is None
        assert await rt.typesense.get_collection(f"{before}_vectors") is None
        assert await rt.typesense.count(group_alias(alias, "tenant-a", 3)) == 3
        assert await rt.typesense.count(group_alias(alias, "tenant-b", 3)) == 2
        out = await braid.recall("how many tulips did Aiko plant", top_k=5, sources=["typesense"])
        assert sorted(i["id"] for i in out["items"]) == sorted(ids_a)
        out = await braid.recall("bicycles sold", key=AGENT_B, top_k=5, sources=["typesense"])
        assert sorted(i["id"] for i in out["items"]) == sorted(ids_b)

    # A start that finds its groups in place starts no job.
    app, _, _ = make_app(postgres, typesense, embedder, grouped(alias, 3), dsn=dsn, alias=alias)
    async with serve(app) as client:
        assert len(await jobs(dsn)) == 1


@pytest.fixture
def second_cluster(tmp_path: Path) -> Iterator[EmbeddedTypesense]:
    """A second Typesense server: a cluster of its own (``typesense.clusters``)."""
    ts = EmbeddedTypesense(tmp_path / "second-typesense")
    ts.start()
    yield ts
    ts.stop()


async def test_groups_live_on_the_clusters_the_config_names(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, second_cluster: EmbeddedTypesense, embedder: Any
) -> None:
    alias = f"mem_{uuid.uuid4().hex[:10]}"
    cfg = grouped(alias, 2)
    more = TypesenseClusterConfig(nodes=[second_cluster.url], api_key=second_cluster.api_key)
    cfg = msgspec.structs.replace(
        cfg,
        typesense=msgspec.structs.replace(cfg.typesense, clusters=[more], own_collection_above=3),
    )
    app, dsn, _ = make_app(
        postgres,
        typesense,
        embedder,
        cfg,
        alias=alias,
        typesense_clusters=(((second_cluster.url,), second_cluster.api_key),),
    )
    # tenant-a's group is 1 of 2, on the second cluster; tenant-b's is 0, on the first.
    first = TypesenseClient([typesense.url], typesense.api_key)
    second = TypesenseClient([second_cluster.url], second_cluster.api_key)
    async with serve(app) as client:
        braid = Braid(client=client, app=app, dsn=dsn, alias=alias)
        rt = braid.runtime
        ids_a = await braid.remember(*({"content": f"Aiko climbed peak {n} in the Alps"} for n in range(4)))
        ids_b = await braid.remember({"content": "Bruno climbed nothing, he fixes bicycles"}, key=AGENT_B)
        await braid.synced()
        assert await second.count(f"{alias}_g1") == 4 and await second.count(f"{alias}_g1_vectors") == 4
        assert await first.count(f"{alias}_g0") == 1
        assert await first.get_alias(f"{alias}_g1") is None and await second.get_alias(f"{alias}_g0") is None
        out = await braid.recall("which peaks did Aiko climb", top_k=4, sources=["typesense"])
        assert sorted(i["id"] for i in out["items"]) == sorted(ids_a)
        out = await braid.recall("bicycles", key=AGENT_B, sources=["typesense"])
        assert [i["id"] for i in out["items"]] == ids_b

        # A rebuild keeps each group on its cluster.
        r = await braid.post("/admin/reindex", {"target": "typesense"}, key=ADMIN_A)
        job = await wait_job(braid, r.json()["job_id"])
        assert job["status"] == "done" and job["progress"]["typesense"]["dropped"] == [], job
        assert await second.count(f"{alias}_g1") == 4 and await first.count(f"{alias}_g0") == 1

        # A moved tenant's pair is on its group's cluster.
        r = await braid.post("/admin/reindex", {"target": "placement"}, key=ADMIN_A)
        job = await wait_job(braid, r.json()["job_id"])
        assert job["status"] == "done" and job["progress"]["placement"]["tenants"] == ["tenant-a"], job
        own = own_alias(alias, "tenant-a")
        assert await second.count(own) == 4 and await second.count(f"{alias}_g1") == 0
        assert await first.get_alias(own) is None
        out = await braid.recall("which peaks did Aiko climb", top_k=4, sources=["typesense"])
        assert sorted(i["id"] for i in out["items"]) == sorted(ids_a)
        assert rt.index.route("tenant-a")[0] is rt.index.clients[1]
    await first.aclose()
    await second.aclose()


def test_fewer_groups_than_clusters_are_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(
            "typesense:\n  groups: 2\n  clusters:\n    - nodes: [http://a:8108]\n    - nodes: [http://b:8108]\n"
        )
    assert str(caught.value).endswith(
        "clusters: 3 clusters (nodes and 2 more) need groups >= 3, got 2: a cluster would hold no group - at `$.typesense`"
    )
