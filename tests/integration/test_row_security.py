"""Row-level security behind the code's tenant filters (migration v5).

Every tenant-scoped transaction runs as ``braid_tenant`` with ``braid.tenant``
set; the policies then let it see and write one tenant's rows, whatever its
statements say. The sources are shown to run under it: with the policy
turned to "no rows", they find nothing although the rows are there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import msgspec
import numpy as np
import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from config import BraidConfig, load_config
from deploy.embedded import EmbeddedPostgres
from indexers.base import Filters, SearchQuery
from indexers.graph import GraphSource
from indexers.migrations import TENANT_TABLES
from indexers.pgvector import PgvectorSource, ensure_indexes
from indexers.postgres import (
    EntityInput,
    MemoryInput,
    PostgresStore,
    Read,
    RelationInput,
    open_pool,
    scope_to_tenant,
    tenant_reads,
    tenant_transaction,
)
from tests.api.conftest import fresh_database

pytestmark = pytest.mark.anyio

DIM = 8
T0 = datetime(2025, 3, 1, tzinfo=UTC)
TENANTS = ("acme", "globex")


def vec(seed: int) -> tuple[float, ...]:
    v = np.random.default_rng(seed).standard_normal(DIM)
    return tuple(float(x) for x in v / np.linalg.norm(v))


@pytest.fixture(scope="module")
def cfg() -> BraidConfig:
    cfg = load_config()
    return msgspec.structs.replace(cfg, embedding=msgspec.structs.replace(cfg.embedding, dim=DIM))


@pytest.fixture(scope="module")
async def pool(postgres: EmbeddedPostgres, cfg: BraidConfig) -> AsyncIterator[AsyncConnectionPool]:
    pool = await open_pool(fresh_database(postgres), dim=DIM, min_size=1, max_size=4)
    store = PostgresStore(pool)
    for n, tenant in enumerate(TENANTS):
        await store.write_memories(
            tenant,
            [
                MemoryInput(
                    content=f"{tenant} keeps the launch codes in the blue safe",
                    id="m1",
                    kind="fact",
                    tier="session",
                    created_at=T0,
                    speaker="Ann",
                    entities=("Blue Safe",),
                    embedding=vec(1),
                    model="synthetic",
                )
            ],
            [EntityInput(name="Blue Safe", type="thing", summary="", embedding=vec(2), model="synthetic")],
        )
        await store.write_graph(
            tenant,
            [EntityInput(name="Ann", type="person", summary="", embedding=vec(3 + n), model="synthetic")],
            [RelationInput(source="Ann", relation="owns", target="Blue Safe")],
        )
    await ensure_indexes(pool, cfg)
    yield pool
    await pool.close()


async def test_a_scoped_transaction_sees_one_tenant_without_any_filter(pool: AsyncConnectionPool) -> None:
    for tenant in TENANTS:
        async with tenant_transaction(pool, tenant) as conn:
            for table in TENANT_TABLES:
                cur = await conn.execute(f"SELECT DISTINCT tenant FROM {table}")
                assert {row[0] for row in await cur.fetchall()} <= {tenant}, table
            cur = await conn.execute("SELECT count(*) FROM memories")
            assert (await cur.fetchone())[0] == 1  # type: ignore[index]
    # Unscoped, the owner sees both: the rows are there.
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT count(DISTINCT tenant) FROM memories")
        assert (await cur.fetchone())[0] == 2  # type: ignore[index]


async def test_the_role_without_a_tenant_sees_nothing(pool: AsyncConnectionPool) -> None:
    async with pool.connection() as conn, conn.transaction():
        await conn.execute("SET LOCAL ROLE braid_tenant")
        for table in TENANT_TABLES:
            cur = await conn.execute(f"SELECT count(*) FROM {table}")
            assert (await cur.fetchone())[0] == 0, table  # type: ignore[index]


async def test_a_scoped_transaction_cannot_write_or_touch_another_tenants_rows(
    pool: AsyncConnectionPool,
) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
        async with tenant_transaction(pool, "acme") as conn:
            await conn.execute("INSERT INTO speakers (tenant, name) VALUES ('globex', 'Mallory')")
    async with pool.connection() as conn, conn.transaction(force_rollback=True):
        await scope_to_tenant(conn, "acme")
        cur = await conn.execute("UPDATE memories SET content = 'gone' WHERE tenant = 'globex'")
        assert cur.rowcount == 0
        cur = await conn.execute("DELETE FROM memories")
        assert cur.rowcount == 1  # its own row only (and rolled back)
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT tenant, content FROM memories ORDER BY tenant")
        assert [r[0] for r in await cur.fetchall()] == ["acme", "globex"]
        # The scope ended with its transaction: the pooled connection is the owner again.
        cur = await conn.execute("SELECT current_user <> 'braid_tenant', current_setting('braid.tenant', true)")
        assert await cur.fetchone() in {(True, None), (True, "")}


async def set_policies(pool: AsyncConnectionPool, using: str) -> None:
    async with pool.connection() as conn:
        for table in TENANT_TABLES:
            await conn.execute(f"ALTER POLICY tenant_rows ON {table} USING ({using}) WITH CHECK ({using})")


POLICY = "tenant = current_setting('braid.tenant', true)"


async def test_sources_and_store_reads_run_under_the_policy(pool: AsyncConnectionPool, cfg: BraidConfig) -> None:
    """With the policy turned to "no rows", every tenant read finds nothing:
    so they run as the restricted role, and the policy is what a forgotten
    filter would fall back on."""
    store = PostgresStore(pool)
    sources = [PgvectorSource(pool, lambda: cfg), GraphSource(pool, lambda: cfg)]
    q = SearchQuery(tenant="acme", text="Blue Safe", vector=vec(1), limit=10, model="synthetic")

    async def seen() -> list[int]:
        counts = [len(await s.search(q)) for s in sources]
        counts.append(len(await store.speakers("acme")))
        counts.append(len(await store.existing_entities("acme", ["Blue Safe"])))
        counts.append(len(await store.live("acme", ["m1"], None)))
        counts.append(len(await store.embeddings("acme", ["m1"], "synthetic")))
        counts.append(0 if await store.memory("acme", "m1") is None else 1)
        counts.append(len(await store.recent("acme", Filters(), min_confidence=0.0, memory_tiers=["session"], limit=5)))
        return counts

    assert all(n > 0 for n in await seen())
    await set_policies(pool, "false")
    try:
        assert await seen() == [0] * 8
    finally:
        await set_policies(pool, POLICY)
    assert all(n > 0 for n in await seen())


async def test_tenant_reads_run_scoped_in_one_transaction_and_leave_nothing_behind(pool: AsyncConnectionPool) -> None:
    rows = await tenant_reads(
        pool,
        "acme",
        [
            Read("SELECT current_user, current_setting('braid.tenant', true), current_setting('hnsw.ef_search')"),
            Read("SELECT DISTINCT tenant FROM memories"),
            Read("SELECT count(*) FROM memories WHERE tenant = 'globex'"),
        ],
        settings={"hnsw.ef_search": "77"},
    )
    assert rows == [[("braid_tenant", "acme", "77")], [("acme",)], [(0,)]]
    # One transaction, whether implicit (the pipeline's) or repeatable read.
    for repeatable_read in (False, True):
        xids = await tenant_reads(
            pool,
            "acme",
            [Read("SELECT txid_current()"), Read("SELECT txid_current()")],
            repeatable_read=repeatable_read,
        )
        assert xids[0] == xids[1], repeatable_read
    isolation = await tenant_reads(pool, "acme", [Read("SELECT current_setting('transaction_isolation')")])
    assert isolation == [[("read committed",)]]
    isolation = await tenant_reads(
        pool, "acme", [Read("SELECT current_setting('transaction_isolation')")], repeatable_read=True
    )
    assert isolation == [[("repeatable read",)]]
    # An error in any statement: nothing of the scope stays on the pooled connection.
    for repeatable_read in (False, True):
        with pytest.raises(psycopg.errors.DivisionByZero):
            await tenant_reads(
                pool,
                "acme",
                [Read("SELECT 1"), Read("SELECT 1 / 0"), Read("SELECT 2")],
                repeatable_read=repeatable_read,
            )
    for _ in range(4):  # every pooled connection
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT current_user <> 'braid_tenant', current_setting('braid.tenant', true)")
            assert await cur.fetchone() in {(True, None), (True, "")}
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


async def test_a_connection_that_failed_a_pipelined_read_or_came_back_in_pipeline_mode_is_not_lent_again(
    postgres: EmbeddedPostgres,
) -> None:
    pool = await open_pool(fresh_database(postgres), dim=DIM, min_size=1, max_size=1)

    async def backend() -> int:
        rows = await tenant_reads(pool, "acme", [Read("SELECT pg_backend_pid()")], repeatable_read=True)
        return int(rows[0][0][0])

    try:
        first = await backend()
        assert await backend() == first  # one connection, lent again while healthy
        with pytest.raises(psycopg.errors.DivisionByZero):
            await tenant_reads(pool, "acme", [Read("SELECT 1 / 0")], repeatable_read=True)
        second = await backend()
        assert second != first
        async with pool.connection() as conn:
            conn.pgconn.enter_pipeline_mode()  # as a pipeline whose exit failed leaves it
        third = await backend()
        assert third != second
        assert await backend() == third
    finally:
        await pool.close()
