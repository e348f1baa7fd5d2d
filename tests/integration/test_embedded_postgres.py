"""The embedded Postgres runs with Braid's server settings, not initdb's defaults."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from deploy.embedded import POSTGRES_SETTINGS, EmbeddedPostgres, shared_buffers_mb


def test_embedded_postgres_runs_with_braid_settings(postgres: EmbeddedPostgres) -> None:
    with psycopg.connect(postgres.dsn(), autocommit=True) as conn:
        shown = {name: conn.execute(f"SHOW {name}").fetchone() for name in POSTGRES_SETTINGS}
    assert {name: row[0] for name, row in shown.items() if row} == POSTGRES_SETTINGS
    assert POSTGRES_SETTINGS["shared_buffers"] == "1GB"


def test_shared_buffers_grow_with_the_hnsw_indexes_within_the_memory() -> None:
    gb = 2**30
    assert shared_buffers_mb(0, 24 * gb) == 1024  # nothing indexed yet: the 1 GB default
    assert shared_buffers_mb(400 * 2**20, 24 * gb) == 1024  # 1.5 x 400 + 256 = 856 -> 1 GB
    assert shared_buffers_mb(2 * gb, 24 * gb) == 3328  # 1.5 x 2048 + 256 = 3328, a multiple of 256
    assert shared_buffers_mb(3 * gb, 24 * gb) == 4864  # 4864 exactly
    assert shared_buffers_mb(30 * gb, 24 * gb) == 9728  # 40% of 24 GB, in 256 MB steps
    assert shared_buffers_mb(0, 2 * gb) == 768  # a small machine: 40% of 2 GB
    assert shared_buffers_mb(0, 256 * 2**20) == 128


def test_a_start_sizes_shared_buffers_from_the_hnsw_indexes_it_finds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pg = EmbeddedPostgres(tmp_path / "pg")
    dsn = pg.start()
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.execute("SHOW shared_buffers").fetchone() == ("1GB",)
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            conn.execute("CREATE TABLE v (id int, e vector(3))")
            conn.execute("INSERT INTO v SELECT i, ARRAY[i, 1, 1]::vector(3) FROM generate_series(1, 2000) i")
            conn.execute("CREATE INDEX v_hnsw ON v USING hnsw (e vector_cosine_ops)")
            size = conn.execute("SELECT pg_relation_size('v_hnsw')").fetchone()
        assert size is not None and size[0] > 0
        # The policy is fixed by the test above; here, what a start hands it and applies.
        seen: list[int] = []

        def sized(hnsw_bytes: int, ram_bytes: int) -> int:
            seen.append(hnsw_bytes)
            return 1280

        monkeypatch.setattr("deploy.embedded.shared_buffers_mb", sized)
        pg.stop()
        dsn = pg.start()
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.execute("SHOW shared_buffers").fetchone() == ("1280MB",)
        assert seen == [size[0]]
    finally:
        pg.stop()
