"""The load benchmark's growth table: figures read from each size's report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.load.growth import growth_table, load_reports, write_growth


def report(p50_8: float, qps: float, ts_ms: float, recall: float) -> dict[str, Any]:
    row = {"embedding": "supplied", "p99": 2 * p50_8, "ratio_p50": 1.1, "sources_p50": {}}
    return {
        "command": "python -m benchmarks.load",
        "recall": [
            {**row, "config": "fused", "clients": 8, "p50": p50_8, "qps": qps},
            {**row, "config": "fused", "clients": 1, "p50": p50_8 / 4, "qps": qps / 2},
            {**row, "config": "typesense", "clients": 1, "p50": ts_ms, "qps": 1.0, "sources_p50": {"typesense": ts_ms}},
        ],
        "write": {"per_s": 500.0},
        "freshness": {"100": {"typesense": {"p99": 40.0}}},
        "hnsw": {"tiers": {"session": {"recall": recall}, "rag": {"recall": 1.0}}},
    }


def test_growth_reads_every_size_and_checks_the_1m_target(tmp_path: Path) -> None:
    for size, args in {100_000: (20.0, 300.0, 8.0, 0.97), 1_000_000: (45.0, 150.0, 30.0, 0.95)}.items():
        (tmp_path / f"load-{size}.json").write_text(json.dumps(report(*args)))
    (tmp_path / "load-tuning.json").write_text("{}")  # not a size: ignored
    reports = load_reports(tmp_path)
    assert list(reports) == [100_000, 1_000_000]
    lines = growth_table(reports)
    assert lines[0] == "| figure | unit | 100,000 | 1,000,000 |"
    assert "| fused p50, 8 clients | ms | 20.0 | 45.0 |" in lines
    assert "| fused recalls/s, 8 clients | 1/s | 300 | 150 |" in lines
    assert "| Typesense source p50, 1 client | ms | 8.0 | 30.0 |" in lines
    assert "| pgvector source p50, 1 client | ms | – | – |" in lines
    assert "| HNSW recall@10, smallest tier |  | 0.970 | 0.950 |" in lines
    assert lines[-1] == "- **FAIL**: fused p50 at 8 clients, 1M 45.0 ms <= 2 x 100k 20.0 ms"
    md = write_growth(tmp_path)
    assert md is not None and md.read_text().startswith("# Load figures against size")
    assert (tmp_path / "load-growth.png").stat().st_size > 0


def test_growth_without_1m_says_not_checked(tmp_path: Path) -> None:
    (tmp_path / "load-10000.json").write_text(json.dumps(report(30.0, 40.0, 20.0, 1.0)))
    assert growth_table(load_reports(tmp_path))[-1].startswith("- not checked: p50 at 1M")
    assert write_growth(tmp_path / "empty") is None
