"""The given-up-reads benchmark's switch between the two modes, and its summary."""

from __future__ import annotations

from typing import Any

from benchmarks.given_up_reads import cut_on_connection, markdown, summary_line, use
from indexers.postgres import generations, pool


def test_use_switches_every_read_and_back() -> None:
    shipped = pool.on_connection
    try:
        use("cut")
        assert pool.on_connection is cut_on_connection and generations.on_connection is cut_on_connection
    finally:
        use("kept")
    assert pool.on_connection is shipped and generations.on_connection is shipped


def _row(mode: str, clients: int, pair: int, per_s: float, sessions: int) -> dict[str, Any]:
    return {
        "mode": mode,
        "clients": clients,
        "pair": pair,
        "per_s": per_s,
        "cpu_ms": {"client": 9.0, "postgres": 4.0, "typesense": 5.0},
        "pool_opened": sessions,
        "pg_sessions": sessions,
        "given_up": 3,
        "closed": sessions,
        "degraded": 0,
    }


def test_the_summary_reads_the_highest_client_count_over_the_pairs() -> None:
    report = {
        "recalls": 600,
        "rows": [
            _row("cut", 8, 1, 90.0, 0),
            _row("kept", 8, 1, 91.0, 0),
            _row("cut", 32, 1, 60.0, 40),
            _row("kept", 32, 1, 80.0, 0),
            _row("cut", 32, 2, 70.0, 30),
            _row("kept", 32, 2, 84.0, 1),
        ],
    }
    assert summary_line(report) == (
        "given-up-reads: clients=32 cut_sessions=70 kept_sessions=1 cut_per_s=65 kept_per_s=82"
    )
    md = markdown(report, "python -m benchmarks.given_up_reads <home>")
    assert "| cut | 32 | 2 | 70 | 9.00 | 4.00 | 5.00 | 30 | 30 | 3 | 30 | 0 |" in md
