"""The replica router's bookkeeping, without a server: WAL positions as
Postgres prints them, the per-tenant positions and their bound, and the
cases that send a recall to the primary before any replica read. (The
routing against a real primary + replica: ``tests/api/test_replica.py``.)"""

from __future__ import annotations

from typing import Any, cast

import pytest

from indexers.postgres import ReplicaRouter, format_lsn, parse_lsn

pytestmark = pytest.mark.anyio


def router(max_tenants: int = 100) -> ReplicaRouter:
    # No pool is touched by what these tests call.
    return ReplicaRouter(cast(Any, None), cast(Any, None), max_tenants=max_tenants)


def test_lsn_text_round_trips() -> None:
    assert parse_lsn("16/B374D848") == (0x16 << 32) | 0xB374D848
    assert parse_lsn("0/0") == 0
    assert parse_lsn(" FFFFFFFF/FFFFFFFF ") == 2**64 - 1
    for text in ("16/B374D848", "0/3000028", "1/0"):
        assert format_lsn(parse_lsn(text)) == text
    with pytest.raises(ValueError) as info:
        parse_lsn("16:B374D848")
    assert str(info.value) == "not a WAL position: '16:B374D848' (expected e.g. '16/B374D848')"
    with pytest.raises(ValueError):
        parse_lsn("123456789/0")


def test_a_tenant_waits_for_its_newest_write() -> None:
    r = router()
    assert r.last_write("a") == 0
    r.wrote("a", 500)
    r.wrote("a", 300)  # a position read late, for an earlier write: never lowers it
    assert (r.last_write("a"), r.last_write("b")) == (500, 0)
    r.wrote_before(400)  # the primary's position at start-up: everyone waits for it
    assert (r.last_write("a"), r.last_write("b")) == (500, 400)


def test_past_its_bound_the_map_becomes_a_floor() -> None:
    r = router(max_tenants=2)
    r.wrote("a", 100)
    r.wrote("b", 200)
    r.wrote("c", 150)  # full, nothing known replayed: every tenant now waits for 200
    assert [r.last_write(t) for t in ("a", "b", "c", "d")] == [200, 200, 200, 200]


async def test_which_recalls_need_no_replica_read() -> None:
    r = router()
    # Out until a probe has read it: the primary, and no read of the replica.
    assert not r.up and await r.use_replica("a") is False
    # As a probe that read 1000 leaves it:
    r._down, r._replayed = False, 1000
    r.wrote("a", 900)
    r.wrote_unknown("b")
    assert await r.use_replica("a") is True  # replayed past a's write
    assert await r.use_replica("c") is True  # no write here
    assert await r.use_replica("b") is False  # its write's position is unknown: the primary
    assert r.probes == 0
