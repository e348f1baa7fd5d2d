"""The fault report's sums and formatting (benchmarks.faults), with exact values."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.faults.__main__ import pytest_summary
from benchmarks.faults.ledger import Ledger, Scenario
from benchmarks.faults.report import (
    failed,
    format_table,
    read_ledger,
    summary_line,
    totals,
    write_report,
)
from benchmarks.faults.soak_report import memory_verdict, per_minute
from benchmarks.faults.workload import Done

SCENARIOS = [
    Scenario(
        name="postgres killed",
        kind="fault",
        injected=1,
        requests=40,
        errors=6,
        server_errors=0,
        writes_acked=30,
        writes_found=30,
        recovery_s=2.5,
        outcome="503 then back",
    ),
    Scenario(name="oversized body", kind="bad input", injected=12, requests=12, errors=12, schema_failures=1),
    Scenario(
        name="soak 10 min",
        kind="soak",
        requests=15000,
        errors=3,
        server_errors=2,
        writes_acked=4000,
        writes_found=3999,
        lost_writes=1,
        duplicates=0,
        leaks=0,
    ),
    Scenario(name="tenant b reads a's id", kind="isolation", injected=3, requests=3, errors=3, leaks=2),
    Scenario(name="ts cluster | leader killed", kind="cluster", injected=2, requests=100),
]


def test_totals_sum_every_count() -> None:
    t = totals(SCENARIOS)
    assert (t.scenarios, t.injected, t.requests, t.errors, t.server_errors) == (5, 18, 15155, 24, 2)
    assert (t.writes_acked, t.writes_found, t.lost_writes, t.duplicates, t.leaks, t.schema_failures) == (
        4030,
        4029,
        1,
        0,
        2,
        1,
    )


def test_summary_line_is_the_closing_line() -> None:
    assert summary_line(totals(SCENARIOS)) == (
        "faults: injected=18 requests=15155 lost_writes=1 server_errors=2 leaks=2 schema_failures=1"
    )
    assert summary_line(totals([])) == (
        "faults: injected=0 requests=0 lost_writes=0 server_errors=0 leaks=0 schema_failures=0"
    )


def test_failed_names_every_reason() -> None:
    assert failed(totals(SCENARIOS[:1]), {"pytest_exit": 0}) == []
    assert failed(totals(SCENARIOS), {"pytest_exit": 1}) == [
        "pytest exited with 1",
        "lost_writes=1",
        "server_errors=2",
        "leaks=2",
        "schema_failures=1",
    ]
    assert failed(totals([]), {}) == ["no pytest run recorded"]
    soak_ok = {"error": None, "memory_flat": True, "servers_died": [], "leftover_processes": 0}
    assert failed(totals([]), {"pytest_exit": 0, "soak": soak_ok}) == []
    soak_bad = {"error": None, "memory_flat": False, "servers_died": ["typesense"], "leftover_processes": 2}
    assert failed(totals([]), {"pytest_exit": 0, "soak": soak_bad}) == [
        "soak memory not flat",
        "soak: typesense died",
        "soak left 2 processes",
    ]
    assert failed(totals([]), {"pytest_exit": 0, "soak": {"error": "TimeoutError: cap"}}) == [
        "soak aborted (TimeoutError: cap)",
    ]


def test_ledger_lines_read_back(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(str(path))
    for s in SCENARIOS:
        ledger.record(s)
    assert read_ledger(path) == SCENARIOS
    assert read_ledger(tmp_path / "absent.jsonl") == []


def test_table_groups_by_kind_in_order() -> None:
    table = format_table(SCENARIOS)
    headings = [line for line in table.splitlines() if line.startswith("### ")]
    assert headings == [
        "### fault (1)",
        "### bad input (1)",
        "### isolation (1)",
        "### soak (1)",
        "### cluster (1)",
        "### Totals",
    ]
    lines = table.splitlines()
    assert "| postgres killed | 1 |  | 40 | 6 | 0 | 30 / 30 | 0 | 0 | 0 | 0 | 2.50 | 503 then back |" in lines
    assert "| ts cluster \\| leader killed | 2 |  | 100 | 0 | 0 | 0 / 0 | 0 | 0 | 0 | 0 | – |  |" in lines
    assert lines[-1] == "| 5 | 18 | 15155 | 24 | 2 | 4030 / 4029 | 1 | 0 | 2 | 1 |"


def test_report_ends_with_the_summary_and_says_why_it_fails(tmp_path: Path) -> None:
    run = {"command": "python -m benchmarks.faults", "pytest_exit": 0, "pytest_summary": "5 passed in 1.00s"}
    text = write_report(SCENARIOS, run, results=tmp_path).read_text()
    assert "pytest: `5 passed in 1.00s` (exit 0)." in text
    assert "Verdict: FAIL (lost_writes=1, server_errors=2, leaks=2, schema_failures=1)." in text
    assert "No soak in this run" in text
    assert text.splitlines()[-2] == summary_line(totals(SCENARIOS))


def test_pytest_summary_line() -> None:
    out = "..F.\n=== short test summary info ===\nFAILED tests/x.py::t\n1 failed, 3 passed, 120 deselected in 12.34s\n"
    assert pytest_summary(out) == "1 failed, 3 passed, 120 deselected in 12.34s"
    assert pytest_summary("===== 2 passed, 1 warning in 0.50s =====\n") == "2 passed, 1 warning in 0.50s"
    assert pytest_summary("\nno tests ran in 0.12s\n") == "no tests ran in 0.12s"
    assert pytest_summary("ImportError: boom\n") == ""


def _samples(rss: list[float], every: float = 5.0) -> list[dict[str, float]]:
    return [{"t": every * (i + 1), "rss_mb": r} for i, r in enumerate(rss)]


def test_memory_verdict_growth_and_slope() -> None:
    # 20 samples, one every 5 s: warm-up ends at 20 s (samples at 20, 25, 30 s: median 502),
    # the last three have median 509: growth 7 MB; the second half (t >= 50 s) rises
    # 1 MB every 5 s: 12 MB/min.
    rss = [400, 450, 480, 500, 502, 503, 500, 500, 500, *range(500, 511)]
    v = memory_verdict(_samples(rss), warmup=0.2, bound_mb=20)
    assert (v["warm_mb"], v["end_mb"], v["growth_mb"], v["peak_mb"], v["flat"]) == (502, 509, 7, 510, True)
    assert round(v["slope_mb_min"], 9) == 12.0
    assert v["summary"] == (
        "502 MB after warm-up, 509 MB at the end (growth +7.0 MB, +1.4%; second-half slope +12.00 MB/min): "
        "flat (bound 20 MB)"
    )
    grown = memory_verdict(_samples([500] * 10 + [530] * 10), warmup=0.2, bound_mb=20)
    assert (grown["growth_mb"], grown["flat"]) == (30, False)
    assert grown["summary"].endswith("NOT flat (bound 20 MB)")
    few = memory_verdict(_samples([500] * 5), 0.2, 20)
    assert (few["flat"], few["summary"]) == (False, "too few samples (5) for a verdict")


def test_per_minute_buckets() -> None:
    done = [
        Done(10, "recall", 200, 10),
        Done(50, "write", 201, 30),
        Done(59.9, "recall", 500, 50),
        Done(61, "recall", 200, 20),
        Done(121.5, "delete", 0, 30000),
    ]  # late: counts in the last minute
    samples = [{"t": 60.0, "rss_mb": 500.0, "outbox_pending": 3}, {"t": 120.0, "rss_mb": 505.0, "outbox_pending": 0}]
    rows = per_minute(done, samples, 120)
    assert [(r["minute"], r["requests"], r["errors"], r["rss_mb"], r["outbox_max"]) for r in rows] == [
        (1, 3, 1, 500.0, 3),
        (2, 2, 1, 505.0, 0),
    ]
    assert rows[0]["error_rate"] == 1 / 3
    assert rows[0]["p50_ms"] == 30.0


def test_report_soak_section(tmp_path: Path) -> None:
    soak = {
        "settings": {"minutes": 10, "clients": 8, "rate": 20.0},
        "achieved_rate": 19.96,
        "saturated": False,
        "requests": 11976,
        "errors": 0,
        "p99_ms": 412.6,
        "p99_after_warmup_ms": 380.4,
        "memory": {"summary": "650 MB after warm-up, 655 MB at the end: flat (bound 20 MB)"},
    }
    (tmp_path / "soak.json").write_text(json.dumps(soak))
    text = write_report([], {"pytest_exit": 0}, results=tmp_path).read_text()
    assert (
        "10 min, 8 clients at 20 requests/s (20.0 sent a second): 11976 requests, 0 errors, "
        "p99 413 ms (after warm-up 380 ms)."
    ) in text.splitlines()
    assert "Memory: 650 MB after warm-up, 655 MB at the end: flat (bound 20 MB)." in text.splitlines()
    assert "![soak: error rate, p99 latency and service RSS over time](soak.png)" not in text  # no plot file
    assert "Verdict: pass." in text
