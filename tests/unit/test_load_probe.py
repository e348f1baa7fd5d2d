"""benchmarks.load.probe: a paused load's report names how far the load got
and shows every recall row it measured, with the service processes it was
sent to and its round."""

from __future__ import annotations

from benchmarks.load.probe import markdown


def _row(config: str, clients: int, p50: float) -> dict:
    return {
        "config": config,
        "clients": clients,
        "embedding": "supplied",
        "n": 10,
        "p50": p50,
        "p99": p50 * 2,
        "qps": 1000 / p50,
        "sources_p50": {config: p50 - 1},
        "degraded": 0,
        "cpu_ms": {"service": 1.0, "postgres": 2.0, "typesense": 3.0, "client": 0.1},
    }


def test_the_report_says_it_is_partial_and_lists_each_row() -> None:
    report = {
        "memories": 790000,
        "session_rows": 553000,
        "size": 1000000,
        "seed": 7,
        "recall": [
            _row("fused", 1, 101.5),
            _row("typesense", 8, 333.25),
            {**_row("fused", 8, 50.0), "services": 2, "round": 1},
        ],
        "direct": {},
        "hnsw": None,
    }
    text = markdown(report, "python -m benchmarks.load.probe <home> --size 1000000 --clients 1,8")
    assert "790000 memories in the big tenant, writes paused" in text
    assert "at 790000 of its 1000000 big-tenant memories (553000 in tier session)" in text
    # config | service processes | round | clients | n | p50 (a row of a report before --services: 1, round 0)
    assert "| fused | 1 | 0 | 1 | 10 | 101.5 |" in text
    assert "| typesense | 1 | 0 | 8 | 10 | 333.2 |" in text or "| typesense | 1 | 0 | 8 | 10 | 333.3 |" in text
    assert "| fused | 2 | 1 | 8 | 10 | 50.0 |" in text
    assert "Not measured" in text  # no HNSW curves: said, not left out silently
