"""Reads whose callers stop waiting (a recall's deadline), against the real
embedded Postgres: the caller is answered at once, the statement is not cut,
and its connection stays in the pool (:func:`indexers.postgres.on_connection`)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from deploy.embedded import EmbeddedPostgres
from indexers.postgres import Read, end_given_up, on_connection, open_pool, tenant_reads
from indexers.postgres import pool as pool_module
from tests.api.conftest import fresh_database

pytestmark = pytest.mark.anyio


@pytest.fixture
async def pool(postgres: EmbeddedPostgres) -> AsyncIterator[AsyncConnectionPool]:
    # One connection: a read that broke it would have the pool open another.
    p = await open_pool(fresh_database(postgres), dim=8, min_size=1, max_size=1)
    yield p
    await end_given_up(p)
    await p.close()


async def backend_pid(pool: AsyncConnectionPool) -> int:
    (rows,) = await tenant_reads(pool, "t", [Read("SELECT pg_backend_pid()")])
    return int(rows[0][0])


async def opened(pool: AsyncConnectionPool) -> int:
    """Connections the pool has opened so far."""
    return int(pool.get_stats().get("connections_num", 0))


async def test_a_read_given_up_returns_at_once_and_keeps_its_connection(pool: AsyncConnectionPool) -> None:
    pid = await backend_pid(pool)
    before = await opened(pool)
    start = time.monotonic()
    with pytest.raises(TimeoutError), anyio.fail_after(0.1):
        await tenant_reads(pool, "t", [Read("SELECT pg_sleep(1.5)")])
    # The caller's deadline held: it did not wait for the statement.
    assert time.monotonic() - start < 1.0
    # The statement ran to its end on the same connection, which the next read gets.
    assert await backend_pid(pool) == pid
    assert await opened(pool) == before


async def test_a_read_given_up_before_it_had_a_connection_never_runs(pool: AsyncConnectionPool) -> None:
    async with pool.connection() as conn:
        await conn.execute("CREATE SEQUENCE given_up")

    async def count(conn: psycopg.AsyncConnection) -> Any:
        cur = await conn.execute("SELECT nextval('given_up')")
        return await cur.fetchone()

    async with anyio.create_task_group() as tg:
        # The pool's one connection, busy for a while.
        tg.start_soon(tenant_reads, pool, "t", [Read("SELECT pg_sleep(0.5)")])
        await anyio.sleep(0.1)
        with anyio.move_on_after(0.1) as waited:
            await on_connection(pool, count)
        assert waited.cancelled_caught
    await anyio.sleep(0.2)
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT is_called FROM given_up")
        assert await cur.fetchone() == (False,)


async def test_a_given_up_read_is_cut_after_its_grace(
    pool: AsyncConnectionPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pool_module, "GIVEN_UP_GRACE_S", 0.3)
    with pytest.raises(TimeoutError), anyio.fail_after(0.1):
        await tenant_reads(pool, "t", [Read("SELECT pg_sleep(60)")])
    # Cut after its grace: the next read gets the pool's one connection
    # without waiting out the minute (nor the pool's 5 s, then a PoolTimeout).
    start = time.monotonic()
    assert await backend_pid(pool) > 0
    assert time.monotonic() - start < 4.0


async def test_end_given_up_cancels_what_runs_on(pool: AsyncConnectionPool) -> None:
    with pytest.raises(TimeoutError), anyio.fail_after(0.1):
        await tenant_reads(pool, "t", [Read("SELECT pg_sleep(60)")])
    with anyio.fail_after(20):
        await end_given_up(pool)
        await pool.close(timeout=0.5)
    assert pool.closed


async def test_an_error_reaches_a_caller_that_waits(pool: AsyncConnectionPool) -> None:
    with pytest.raises(psycopg.errors.DivisionByZero):
        await tenant_reads(pool, "t", [Read("SELECT 1 / 0")])
    assert await backend_pid(pool) > 0
