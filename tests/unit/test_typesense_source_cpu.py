"""benchmarks.typesense_source_cpu: its report and last line say which tree
cost what and whether the two returned the same hits."""

from __future__ import annotations

from typing import Any

from benchmarks.typesense_source_cpu import markdown, summary_line


def _report(digests: tuple[str, str]) -> dict[str, Any]:
    runs = [
        {"round": 0, "tree": "/new", "ms": [0.75, 0.7, 0.8], "hits": 150, "digest": digests[0]},
        {"round": 0, "tree": "/old", "ms": [0.95, 0.9, 1.0], "hits": 150, "digest": digests[1]},
    ]
    return {
        "command": "python -m benchmarks.typesense_source_cpu <home> --against /old",
        "size": 10000,
        "queries": 300,
        "tree": "/new",
        "ms": 0.75,
        "against": "/old",
        "against_ms": 0.95,
        "same_hits": digests[0] == digests[1],
        "runs": runs,
    }


def test_the_last_line_names_both_medians_and_the_hits() -> None:
    assert summary_line(_report(("a" * 64, "a" * 64))) == (
        "typesense-source-cpu: queries=300 ms=0.750 against_ms=0.950 same_hits=true"
    )
    alone = {**_report(("a" * 64, "a" * 64)), "against": None, "against_ms": None}
    assert summary_line(alone) == "typesense-source-cpu: queries=300 ms=0.750 same_hits=true"


def test_the_report_lists_each_run_and_says_when_the_hits_differ() -> None:
    same = markdown(_report(("a" * 64, "a" * 64)))
    assert "| 0 | `/new` | 0.750 / 0.700 / 0.800 | 150 | `aaaaaaaaaaaaaaaa` |" in same
    assert "| 0 | `/old` | 0.950 / 0.900 / 1.000 | 150 |" in same
    assert "the same hits: yes" in same
    assert "the same hits: **no**" in markdown(_report(("a" * 64, "b" * 64)))
