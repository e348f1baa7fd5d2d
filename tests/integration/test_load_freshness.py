"""The load benchmark's unprobed Typesense freshness, read from a real outbox."""

from __future__ import annotations

import psycopg
import pytest

from benchmarks.load.run import _applied_after_ack_ms
from deploy.embedded import EmbeddedPostgres
from indexers.postgres import open_pool
from tests.api.conftest import fresh_database

pytestmark = pytest.mark.anyio


async def test_freshness_is_from_the_ack_to_the_newest_processed_row_never_below_zero(
    postgres: EmbeddedPostgres,
) -> None:
    dsn = fresh_database(postgres)
    pool = await open_pool(dsn, dim=384, min_size=1, max_size=1)  # migrates: the outbox table
    await pool.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        now = float(conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()[0])  # type: ignore[index]
        rows = [
            # processed 20 ms after its ack
            ("steady-1", 0.020),
            # an older row of the same memory, then the newest: the newest counts
            ("steady-2", -1.0),
            ("steady-2", 0.050),
            # processed before the ack reached the client
            ("steady-3", -0.005),
        ]
        for mid, after in rows:
            conn.execute(
                "INSERT INTO outbox (tenant, memory_id, op, processed_at) VALUES ('big', %s, 'upsert', to_timestamp(%s))",
                (mid, now + after),
            )
        conn.execute("INSERT INTO outbox (tenant, memory_id, op) VALUES ('big', 'steady-4', 'upsert')")  # pending
    acked = {"steady-1": now, "steady-2": now, "steady-3": now, "steady-4": now}
    got = sorted(_applied_after_ack_ms(dsn, acked))
    assert got[0] == 0.0
    assert got[1:] == pytest.approx([20.0, 50.0], abs=0.01)
    assert len(got) == 3  # the pending one has no figure
    assert _applied_after_ack_ms(dsn, {}) == []
