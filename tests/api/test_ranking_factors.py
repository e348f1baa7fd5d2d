"""Ranking by time, importance and use, end to end: real Postgres, Typesense and model.

The bookkeeping tests read ``memory_usage`` in Postgres directly: a recall's
returned memories are counted there by the background writer, a recall with
``track: false`` is not, and a full queue drops counts instead of making a
recall wait.
"""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
import psycopg
import pytest

from indexers.bookkeeping import Bookkeeper

from . import conftest
from .conftest import Braid, FileConfigured, make_app, serve

pytestmark = pytest.mark.anyio

CITY_OLD = {"id": "city-old", "content": "I live in Lisbon now.", "created_at": "2025-01-10T09:00:00Z"}
CITY_NEW = {"id": "city-new", "content": "I live in Porto now.", "created_at": "2025-11-02T09:00:00Z"}
FILLER = [
    {"content": c, "created_at": "2025-06-01T09:00:00Z"}
    for c in (
        "The quarterly report is due on Friday.",
        "We moved the standup to 10am.",
        "Bananas are cheaper at the corner market.",
    )
]


def usage_rows(dsn: str) -> dict[str, tuple[int, Any]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT memory_id, usage_count, last_accessed_at FROM memory_usage").fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


async def wait_written(braid: Braid, at_least: int, timeout: float = 10.0) -> None:
    bk = braid.runtime.bookkeeper
    with anyio.fail_after(timeout):
        while bk.written < at_least:
            await anyio.sleep(0.05)


async def test_reference_time_recency_and_factors_shown(configured: FileConfigured) -> None:
    configured.write("ranking:\n  recencyWeight: 0.0\n")
    assert (await configured.reload()).status_code == 200
    braid = configured.braid
    await braid.remember(CITY_OLD, CITY_NEW, *FILLER)
    await braid.synced()
    query = {"query": "which city do I live in", "reference_time": "2025-11-20T00:00:00+01:00", "track": False}
    off = await braid.recall(**query)
    assert all("recency" not in i["factors"] for i in off["items"])

    configured.write("ranking:\n  recencyWeight: 0.5\n  recencyHalfLifeDays: 30\n")
    assert (await configured.reload()).status_code == 200
    on = await braid.recall(**query)
    by_id = {i["id"]: i for i in on["items"]}
    new, old = by_id["city-new"], by_id["city-old"]
    # 17 days and 313 days (and one hour: the reference time is 2025-11-19T23:00Z) before it.
    assert new["factors"]["recency"] == pytest.approx(1 + 0.5 * 30 / (30 + 17 + 14 / 24))
    assert old["factors"]["recency"] == pytest.approx(1 + 0.5 * 30 / (30 + 313 + 14 / 24))
    for item in on["items"]:
        assert item["score"] == pytest.approx(item["rrf_score"] * _prod(item["factors"].values()))
    assert [i["id"] for i in on["items"]].index("city-new") < [i["id"] for i in on["items"]].index("city-old")

    # The same recall a year later: both are old, the bonus nearly gone.
    later = await braid.recall(**{**query, "reference_time": "2027-11-20T00:00:00Z"})
    assert {i["id"]: i for i in later["items"]}["city-new"]["factors"]["recency"] < 1.05


async def test_importance_is_read_from_every_source(configured: FileConfigured) -> None:
    configured.write("ranking:\n  importanceWeight: 0.4\n")
    assert (await configured.reload()).status_code == 200
    braid = configured.braid
    await braid.remember(
        {"id": "low", "content": "The wifi password is hunter2.", "importance": 0.1},
        {"id": "plain", "content": "The wifi password is swordfish."},
        *FILLER,
    )
    await braid.synced()
    for sources in (["typesense"], ["pgvector"], None):
        body: dict[str, Any] = {"query": "wifi password", "track": False}
        if sources:
            body["sources"] = sources
        out = await braid.recall(**body)
        by_id = {i["id"]: i for i in out["items"]}
        assert by_id["low"]["importance"] == pytest.approx(0.1)
        assert by_id["low"]["factors"]["importance"] == pytest.approx(1 + 0.4 * (0.2 - 1)), sources
        assert "importance" not in by_id["plain"]["factors"]
        assert by_id["plain"]["importance"] is None


async def test_a_restatement_takes_the_place_of_what_it_restates(configured: FileConfigured) -> None:
    # The old and the new value said minutes apart: recency cannot tell them apart.
    old = {"id": "said-first", "content": "I live in Lisbon.", "created_at": "2025-11-02T09:00:00Z"}
    new = {"id": "said-later", "content": "I live in Porto now.", "created_at": "2025-11-02T09:05:00Z"}
    configured.write("ranking:\n  recencyWeight: 0.0\n")
    assert (await configured.reload()).status_code == 200
    braid = configured.braid
    await braid.remember(old, new, *FILLER)
    await braid.synced()
    query = {"query": "I live in Lisbon.", "track": False}
    off = [i["id"] for i in (await braid.recall(**query))["items"]]
    assert off.index("said-first") < off.index("said-later")

    configured.write("ranking:\n  recencyWeight: 0.0\n  restatementSimilarity: 0.5\n")
    assert (await configured.reload()).status_code == 200
    on = (await braid.recall(**query))["items"]
    ids = [i["id"] for i in on]
    assert ids.index("said-later") < ids.index("said-first")
    # The two swapped places; every other memory kept its own.
    assert sorted((off.index("said-first"), off.index("said-later"))) == sorted(
        (ids.index("said-first"), ids.index("said-later"))
    )
    assert [i for i in ids if not i.startswith("said-")] == [i for i in off if not i.startswith("said-")]
    by_id = {i["id"]: i for i in on}
    assert by_id["said-later"]["factors"]["restated"] > 1 > by_id["said-first"]["factors"]["restated"]
    for item in on:
        assert item["score"] == pytest.approx(item["rrf_score"] * _prod(item["factors"].values()))


async def test_bookkeeping_counts_returned_memories_and_respects_track(configured: FileConfigured) -> None:
    configured.write("ranking:\n  usageWeight: 0.5\n")
    assert (await configured.reload()).status_code == 200
    braid = configured.braid
    await braid.remember(CITY_OLD, CITY_NEW, *FILLER)
    await braid.synced()
    untracked = await braid.recall("which city do I live in", track=False, top_k=2)
    assert len(untracked["items"]) == 2
    await anyio.sleep(braid.runtime.bookkeeper.flush_s * 2)
    assert usage_rows(braid.dsn) == {}

    first = await braid.recall("which city do I live in", top_k=2)
    returned = [i["id"] for i in first["items"]]
    await braid.recall("which city do I live in", top_k=2)
    await wait_written(braid, 4)
    rows = usage_rows(braid.dsn)
    assert {k: v[0] for k, v in rows.items()} == {i: 2 for i in returned}
    # The counts now feed the usage factor.
    third = await braid.recall("which city do I live in", top_k=2, track=False)
    assert third["items"][0]["factors"]["usage"] == pytest.approx(1 + 0.5 * _ln(3) / _ln(101))

    # A deleted memory's count goes with it.
    r = await braid.client.delete(f"/v1/memories/{returned[0]}", headers=braid.headers("agent-key-tenant-a-0123456789"))
    assert r.status_code == 200, r.text
    assert returned[0] not in usage_rows(braid.dsn)


async def test_a_full_queue_drops_instead_of_blocking(postgres, typesense, embedder) -> None:  # type: ignore[no-untyped-def]
    cfg = conftest.test_config("unused")
    cfg = msgspec.structs.replace(
        cfg, bookkeeping=msgspec.structs.replace(cfg.bookkeeping, queue_size=2, flush_ms=600_000, batch_size=1000)
    )
    app, dsn, alias = make_app(postgres, typesense, embedder, cfg)
    async with serve(app) as client:
        braid = Braid(client=client, app=app, dsn=dsn, alias=alias)
        await braid.remember(CITY_OLD, CITY_NEW, *FILLER)
        await braid.synced()
        bk: Bookkeeper = braid.runtime.bookkeeper
        out = await braid.recall("which city do I live in", top_k=3)
        # The two memories that match (the floors leave the filler out).
        assert [i["id"] for i in out["items"]] == ["city-new", "city-old"]
        assert bk.stats().queued == 2
        # The queue is full: the next recall still answers, its uses are dropped and counted.
        with anyio.fail_after(5):
            again = await braid.recall("which city do I live in", top_k=3)
        assert [i["id"] for i in again["items"]] == [i["id"] for i in out["items"]]
        assert bk.stats().dropped == 2
        health = (await client.get("/health")).json()
        assert health["bookkeeping"] == {"queued": 2, "written": 0, "dropped": 2, "failed": 0}
        # What was queued is written on the next flush.
        assert await bk.flush() == 2
        assert sum(v[0] for v in usage_rows(dsn).values()) == 2


async def test_a_failing_batch_is_counted_not_raised(braid: Braid) -> None:
    await braid.remember(CITY_OLD)
    bk = braid.runtime.bookkeeper
    real_pool = bk._pool

    class Down:
        def connection(self):  # type: ignore[no-untyped-def]
            raise psycopg.OperationalError("injected: postgres down")

    bk._pool = Down()  # type: ignore[assignment]
    try:
        bk.record("tenant-a", ["city-old"])
        assert await bk.flush() == 1
    finally:
        bk._pool = real_pool
    assert bk.stats().failed == 1
    assert usage_rows(braid.dsn) == {}


def _prod(values: Any) -> float:
    out = 1.0
    for v in values:
        out *= v
    return out


def _ln(x: float) -> float:
    import math

    return math.log(x)
