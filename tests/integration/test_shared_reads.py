"""Reads of one tenant asked for in one turn of the event loop share a round
trip (:func:`indexers.postgres.tenant_reads`), against the real embedded
Postgres: one transaction, each read under the settings it asked for and
no other, an error raised to its own read only, a caller that leaves
taking nothing from the others."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from deploy.embedded import EmbeddedPostgres
from indexers.postgres import Read, end_given_up, open_pool, tenant_reads
from tests.api.conftest import fresh_database

pytestmark = pytest.mark.anyio

XID = Read("SELECT txid_current(), current_setting('braid.tenant', true)")


@pytest.fixture
async def pool(postgres: EmbeddedPostgres) -> AsyncIterator[AsyncConnectionPool]:
    p = await open_pool(fresh_database(postgres), dim=8, min_size=1, max_size=4)
    yield p
    await end_given_up(p)
    await p.close()


async def test_reads_of_one_tenant_asked_together_run_in_one_transaction(pool: AsyncConnectionPool) -> None:
    a, b, other = await asyncio.gather(
        tenant_reads(pool, "acme", [XID]),
        tenant_reads(pool, "acme", [Read("SELECT 1"), XID]),
        tenant_reads(pool, "globex", [XID]),
    )
    # Each caller gets its own statements' rows, in its order.
    assert b[0] == [(1,)]
    assert a[0][0] == b[1][0]  # one transaction id: one transaction
    assert a[0][0][1] == "acme"
    # Another tenant is never in the same transaction (its scope differs).
    assert other[0][0][1] == "globex"
    assert other[0][0][0] != a[0][0][0]
    # Asked for one after the other, they do not wait for each other.
    (first,) = await tenant_reads(pool, "acme", [XID])
    (second,) = await tenant_reads(pool, "acme", [XID])
    assert first[0][0] != second[0][0]


async def test_a_shared_read_runs_under_its_own_settings_only(pool: AsyncConnectionPool) -> None:
    setting = Read("SELECT current_setting('hnsw.ef_search', true), txid_current()")
    default = (await tenant_reads(pool, "acme", [setting]))[0][0][0]
    plain, tuned, isolation, other = await asyncio.gather(
        tenant_reads(pool, "acme", [setting]),
        tenant_reads(pool, "acme", [setting], settings={"hnsw.ef_search": "77"}, repeatable_read=True),
        tenant_reads(pool, "acme", [Read("SELECT current_setting('transaction_isolation'), txid_current()")]),
        tenant_reads(pool, "acme", [setting], settings={"hnsw.ef_search": "55"}),
    )
    assert plain[0][0][0] == default != "77"
    assert tuned[0][0][0] == "77"
    assert other[0][0][0] == "55"
    # The reads without settings or with the first settings shared one transaction, at the
    # strongest isolation asked for; the read with other settings ran in another.
    assert plain[0][0][1] == tuned[0][0][1] == isolation[0][0][1] != other[0][0][1]
    assert isolation[0][0][0] == "repeatable read"
    # The settings ended with the transaction.
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT current_setting('hnsw.ef_search', true)")
        # (A setting the session never loaded reads '' once a transaction set it.)
        assert await cur.fetchone() in {(default,), ("",)}


async def test_a_failing_statement_fails_its_own_read_only(pool: AsyncConnectionPool) -> None:
    failed, fine, also_fine = await asyncio.gather(
        tenant_reads(pool, "acme", [Read("SELECT 1"), Read("SELECT 1 / 0")]),
        tenant_reads(pool, "acme", [Read("SELECT 2")]),
        tenant_reads(pool, "acme", [Read("SELECT 3")], repeatable_read=True),
        return_exceptions=True,
    )
    assert isinstance(failed, psycopg.errors.DivisionByZero)
    assert fine == [[(2,)]]
    assert also_fine == [[(3,)]]


async def test_a_caller_that_leaves_takes_nothing_from_the_others(pool: AsyncConnectionPool) -> None:
    outcome: dict[str, Any] = {}

    async def leaver() -> None:
        start = time.monotonic()
        with anyio.move_on_after(0.1) as scope:
            await tenant_reads(pool, "acme", [Read("SELECT pg_sleep(0.6)")])
        outcome["left"] = (scope.cancelled_caught, time.monotonic() - start)

    async def stayer() -> None:
        outcome["rows"] = await tenant_reads(pool, "acme", [Read("SELECT 7")])

    async with anyio.create_task_group() as tg:
        tg.start_soon(leaver)
        tg.start_soon(stayer)
    left, waited = outcome["left"]
    assert left and waited < 0.5
    assert outcome["rows"] == [[(7,)]]


async def test_a_read_whose_caller_left_before_it_was_sent_never_runs(pool: AsyncConnectionPool) -> None:
    async with pool.connection() as conn:
        await conn.execute("CREATE SEQUENCE never_sent")

    async def asked_and_left() -> None:
        with anyio.CancelScope() as scope:
            scope.cancel()
            await tenant_reads(pool, "acme", [Read("SELECT nextval('never_sent')")])

    await asked_and_left()
    await anyio.sleep(0.1)
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT is_called FROM never_sent")
        assert await cur.fetchone() == (False,)


async def test_when_the_first_caller_leaves_before_sending_the_others_read_alone(pool: AsyncConnectionPool) -> None:
    async with pool.connection() as conn:
        await conn.execute("CREATE SEQUENCE first_left")
    outcome: dict[str, Any] = {}

    async def first() -> None:
        with anyio.CancelScope() as scope:
            scope.cancel()  # delivered at its first wait: the turn the others join in
            await tenant_reads(pool, "acme", [Read("SELECT nextval('first_left')")])
        outcome["first left"] = scope.cancelled_caught

    async def joined() -> None:
        outcome["rows"] = await tenant_reads(pool, "acme", [Read("SELECT 5")])

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        tg.start_soon(joined)
    assert outcome == {"first left": True, "rows": [[(5,)]]}
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT is_called FROM first_left")
        assert await cur.fetchone() == (False,)
