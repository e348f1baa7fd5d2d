"""The per-statement CPU benchmark's log parser (benchmarks/statement_cpu.py),
on log text in the format Postgres 18 writes with ``log_statement_stats``."""

from __future__ import annotations

import pytest

from benchmarks.statement_cpu import markdown, parse_log


def entry(pid: int, kind: str, user: float, system: float, total: float, statement: str) -> str:
    return (
        f"2026-11-28 15:31:49.024 UTC [{pid}] LOG:  {kind} STATISTICS\n"
        f"2026-11-28 15:31:49.024 UTC [{pid}] DETAIL:  ! system usage stats:\n"
        f"\t!\t{user:.6f} s user, {system:.6f} s system, 0.000100 s elapsed\n"
        f"\t!\t[{total:.6f} s user, 0.100000 s system total]\n"
        "\t!\t168316 kB max resident size\n"
        f"2026-11-28 15:31:49.024 UTC [{pid}] STATEMENT:  {statement}\n"
    )


def test_cpu_is_summed_by_statement_and_message_and_the_backends_totals_are_read() -> None:
    walk = "SELECT * FROM memories m\n\t    WHERE m.tenant = $1"
    text = "".join(
        [
            "2026-11-28 15:31:49.000 UTC [7] LOG:  checkpoint starting: time\n",
            entry(7, "BIND MESSAGE", 0.000100, 0.000010, 1.0, walk),
            entry(8, "EXECUTE MESSAGE", 0.002000, 0.000500, 2.0, walk),
            entry(7, "EXECUTE MESSAGE", 0.001000, 0.000000, 1.5, walk),
            entry(8, "EXECUTE MESSAGE", 0.000030, 0.000000, 2.25, "COMMIT"),
        ]
    )
    out = parse_log(text)
    key = "SELECT * FROM memories m WHERE m.tenant = $1"
    assert set(out["by_statement"]) == {key, "COMMIT"}
    assert out["by_statement"][key]["BIND MESSAGE"] == pytest.approx(0.00011)
    assert out["by_statement"][key]["EXECUTE MESSAGE"] == pytest.approx(0.0035)
    assert out["executes"] == {key: 2, "COMMIT": 1}
    # Backend 7: 1.0 -> 1.5, backend 8: 2.0 -> 2.25 (the first entry's total is the start).
    assert out["backends_s"] == pytest.approx(0.75)


def test_an_entry_without_its_statement_line_is_not_counted() -> None:
    text = entry(9, "EXECUTE MESSAGE", 0.5, 0.0, 3.0, "SELECT 1").replace(
        "2026-11-28 15:31:49.024 UTC [9] STATEMENT:  SELECT 1\n", ""
    )
    out = parse_log(text)
    assert out["by_statement"] == {} and out["executes"] == {}


def test_a_writes_report_reads_per_write() -> None:
    report = {
        "size": 100,
        "seconds": 20.0,
        "clients": 8,
        "writes": 50.0,
        "write_errors": ["write 503 b'busy'"],
        "recalls": 1000,
        "qps": 48.0,
        "backends_ms_per_recall": 9.5,
        "attributed_ms_per_recall": 8.5,
        "statements": [{"statement": "INSERT INTO memories (a|b)", "per_recall": 1.0, "ms_per_recall": 5.5}],
    }
    text = markdown(report, "python -m benchmarks.statement_cpu --writes 50")
    assert text.startswith("# Postgres CPU per statement of a fused write")
    assert "1000 writes, 1 errors" in text and "9.50 ms a write" in text
    assert "| runs a write | CPU ms a write |" in text
    assert "| `INSERT INTO memories (a\\|b)` | 1.00 | 5.500 |" in text
    recalls = markdown({**report, "writes": 0.0}, "python -m benchmarks.statement_cpu")
    assert "fused recall" in recalls and "a write" not in recalls
