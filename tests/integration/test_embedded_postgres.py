"""The embedded Postgres runs with Braid's server settings, not initdb's defaults."""

from __future__ import annotations

import psycopg

from deploy.embedded import POSTGRES_SETTINGS, EmbeddedPostgres


def test_embedded_postgres_runs_with_braid_settings(postgres: EmbeddedPostgres) -> None:
    with psycopg.connect(postgres.dsn(), autocommit=True) as conn:
        shown = {name: conn.execute(f"SHOW {name}").fetchone() for name in POSTGRES_SETTINGS}
    assert {name: row[0] for name, row in shown.items() if row} == POSTGRES_SETTINGS
    assert POSTGRES_SETTINGS["shared_buffers"] == "1GB"
