"""Recalls read a real streaming replica (``postgres.replicaDsn``) and keep
read-your-writes: a write-then-recall loop never misses its own write while
the replica serves recalls; with the replica's replay paused a tenant that
wrote reads the primary and one that did not still reads the replica; a
``Braid-Lsn`` header carries the guarantee to another process; with the
replica stopped recalls answer from the primary, and read it again once it is
back.

The replica is made from the session's embedded Postgres with
``pg_basebackup -R`` (:class:`deploy.embedded.EmbeddedReplica`) and listens
on a free loopback port.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from deploy.embedded import EmbeddedPostgres, EmbeddedReplica, EmbeddedTypesense
from indexers.postgres import parse_lsn

from . import conftest
from .conftest import AGENT_A, AGENT_B, Braid, fresh_database, make_app, serve

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def replica(postgres: EmbeddedPostgres, stack_home: Path) -> Iterator[EmbeddedReplica]:
    standby = EmbeddedReplica(postgres, stack_home / f"replica-{uuid.uuid4().hex[:6]}")
    standby.start()
    yield standby
    standby.stop(mode="immediate")


def wait_visible(replica: EmbeddedReplica, database: str, timeout: float = 30.0) -> None:
    """Wait until the replica has replayed the creation of ``database``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(replica.dsn(database), connect_timeout=2):
                return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def on_replica(replica: EmbeddedReplica, sql: str) -> Any:
    with psycopg.connect(replica.dsn(), autocommit=True) as conn:
        row = conn.execute(sql).fetchone()
    return None if row is None else row[0]


@asynccontextmanager
async def replicated(
    postgres: EmbeddedPostgres,
    typesense: EmbeddedTypesense,
    embedder: Any,
    replica: EmbeddedReplica,
    dsn: str | None = None,
    alias: str | None = None,
) -> AsyncIterator[Braid]:
    """A served Braid whose recalls may read ``replica`` (on a fresh database,
    or on ``dsn``'s and ``alias``'s), once the replica has replayed past the
    primary's position at the service's start, which every recall waits for
    (``ReplicaRouter.wrote_before``): a test that pauses the replay before
    that would find every recall on the primary."""
    dsn = dsn or fresh_database(postgres)
    database = urlsplit(dsn).path.lstrip("/")
    wait_visible(replica, database)
    cfg = conftest.patient(conftest.test_config("unused"))
    app, dsn, alias = make_app(
        postgres, typesense, embedder, cfg, dsn=dsn, alias=alias, replica_dsn=replica.dsn(database)
    )
    async with serve(app) as client:
        braid = Braid(client=client, app=app, dsn=dsn, alias=alias)
        router = braid.runtime.engine.replica
        assert router is not None
        with anyio.fail_after(10):
            # A tenant that wrote nothing here waits for that position alone.
            while not await router.router.use_replica("no writes here"):
                await anyio.sleep(0.05)
        yield braid


async def served(braid: Braid) -> dict[str, float]:
    """``braid_recalls_served_total`` by Postgres, from ``/metrics``."""
    r = await braid.client.get("/metrics")
    assert r.status_code == 200, r.text
    out = {"primary": 0.0, "replica": 0.0}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            if sample.name == "braid_recalls_served_total":
                out[sample.labels["by"]] = sample.value
    return out


async def write_recall(braid: Braid, text: str, key: str = AGENT_A) -> tuple[str, dict[str, Any]]:
    (memory_id,) = await braid.remember({"content": text}, key=key)
    return memory_id, await braid.recall(text, key=key)


def ids(out: dict[str, Any]) -> list[str]:
    return [item["id"] for item in out["items"]]


async def test_write_then_recall_never_misses_its_write(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any, replica: EmbeddedReplica
) -> None:
    async with replicated(postgres, typesense, embedder, replica) as braid:
        missed: list[int] = []
        by = {"primary": 0, "replica": 0}
        for i in range(200):
            text = f"Reminder {i}: the locker code for crate {uuid.uuid4().hex[:8]} is {i * 7919 % 10007}"
            memory_id, out = await write_recall(braid, text)
            by[out["served_by"]] += 1
            assert not out["degraded"], out["degraded"]
            if memory_id not in ids(out):
                missed.append(i)
        assert missed == [], f"recalls that missed their own write: {missed} (served {by})"
        counts = await served(braid)
        assert counts == {"primary": by["primary"], "replica": by["replica"]}
        assert counts["replica"] > 0, counts
        stats = (await braid.client.get("/health")).json()["replica"]
        assert stats["status"] == "up"
        assert (stats["served_replica"], stats["served_primary"], stats["fallbacks"]) == (
            by["replica"],
            by["primary"],
            0,
        )


async def test_paused_replay_sends_the_writer_to_the_primary(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any, replica: EmbeddedReplica
) -> None:
    async with replicated(postgres, typesense, embedder, replica) as braid:
        (b_id,) = await braid.remember({"content": "Tenant B keeps its bikes in the blue shed"}, key=AGENT_B)
        # Once the replica has B's write, B's recalls read it.
        with anyio.fail_after(10):
            while (await braid.recall("Where are the bikes?", key=AGENT_B))["served_by"] != "replica":
                await anyio.sleep(0.05)
        on_replica(replica, "SELECT pg_wal_replay_pause()")
        try:
            a_id, out = await write_recall(braid, "Tenant A parked the van behind the bakery")
            assert out["served_by"] == "primary" and a_id in ids(out)
            # Still the primary while the replica stays behind A's write.
            again = await braid.recall("Where is the van parked?")
            assert again["served_by"] == "primary" and a_id in ids(again)
            # B wrote nothing since: the replica, which has B's write, serves it,
            # without reading its replay position again (the cached one is past B's write).
            router = braid.runtime.engine.replica
            assert router is not None
            probes = router.router.stats().probes
            b_out = await braid.recall("Where are the bikes?", key=AGENT_B)
            assert b_out["served_by"] == "replica" and b_id in ids(b_out)
            assert router.router.stats().probes == probes
        finally:
            on_replica(replica, "SELECT pg_wal_replay_resume()")
        with anyio.fail_after(10):
            while (out := await braid.recall("Where is the van parked?"))["served_by"] != "replica":
                await anyio.sleep(0.05)
        assert a_id in ids(out)


async def test_braid_lsn_carries_the_guarantee_to_another_process(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any, replica: EmbeddedReplica
) -> None:
    """Two services on one database: a write through the first, a recall
    through the second. With the replay paused the second does not know of
    the write and reads the replica (missing it) unless the recall brings the
    write's ``Braid-Lsn``, which sends it to the primary."""
    async with replicated(postgres, typesense, embedder, replica) as first:
        async with replicated(postgres, typesense, embedder, replica, dsn=first.dsn, alias=first.alias) as second:
            on_replica(replica, "SELECT pg_wal_replay_pause()")
            try:
                text = "The spare key hangs on the hook by the cellar door"
                r = await first.post("/v1/memories", {"memories": [{"content": text}]})
                assert r.status_code == 201, r.text
                (memory_id,) = r.json()["ids"]
                lsn = r.headers["Braid-Lsn"]
                body = {"query": text}
                plain = (await second.post("/v1/recall", body)).json()
                assert plain["served_by"] == "replica" and memory_id not in ids(plain)
                r = await second.client.post(
                    "/v1/recall", json=body, headers={**second.headers(AGENT_A), "Braid-Lsn": lsn}
                )
                assert r.status_code == 200, r.text
                assert r.json()["served_by"] == "primary" and memory_id in ids(r.json())
                r = await second.client.post(
                    "/v1/recall", json=body, headers={**second.headers(AGENT_A), "Braid-Lsn": "zz"}
                )
                assert r.status_code == 400
                assert r.json()["detail"] == "Braid-Lsn: not a WAL position: 'zz' (expected e.g. '16/B374D848')"
                # A delete's answer carries the position too, at or past the write's.
                r = await first.client.delete(f"/v1/memories/{memory_id}", headers=first.headers(AGENT_A))
                assert r.status_code == 200, r.text
                assert parse_lsn(r.headers["Braid-Lsn"]) >= parse_lsn(lsn)
            finally:
                on_replica(replica, "SELECT pg_wal_replay_resume()")


async def test_a_stopped_replica_leaves_recalls_to_the_primary(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any, replica: EmbeddedReplica
) -> None:
    async with replicated(postgres, typesense, embedder, replica) as braid:
        (memory_id,) = await braid.remember({"content": "The boiler was serviced in March"})
        with anyio.fail_after(10):
            while (await braid.recall("When was the boiler serviced?"))["served_by"] != "replica":
                await anyio.sleep(0.05)
        replica.stop(mode="immediate")
        try:
            for _ in range(5):
                out = await braid.recall("When was the boiler serviced?")
                assert out["served_by"] == "primary" and not out["degraded"], out
                assert memory_id in ids(out)
            health = (await braid.client.get("/health")).json()
            assert health["status"] == "ok" and health["replica"]["status"] == "down"
            assert health["replica"]["fallbacks"] <= 1
        finally:
            replica.start()
        # Back: the background probe finds it and recalls read it again.
        with anyio.fail_after(20):
            while (out := await braid.recall("When was the boiler serviced?"))["served_by"] != "replica":
                await anyio.sleep(0.1)
        assert memory_id in ids(out)
