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


def _direct(ts_qps: float, ts_p50: float, ts_cpu: float, pg_cpu: float) -> dict:
    def row(clients: int, qps: float, p50: float, cpu: dict) -> dict:
        return {"clients": clients, "n": 10, "p50": p50, "p99": p50, "qps": qps, "cpu_ms": cpu}

    return {
        "typesense": [
            row(1, ts_qps / 2, ts_p50, {"typesense": ts_cpu}),
            row(8, ts_qps, ts_p50 * 4, {"typesense": ts_cpu}),
        ],
        "pgvector": [row(8, 300.0, 3.0, {"postgres": pg_cpu})],
    }


def test_each_round_has_its_own_ratios_and_the_last_line_gives_their_medians_and_ranges() -> None:
    from benchmarks.load.probe import round_ratios, summary_line

    recall = []
    for turn, (f1_p50, f8_p50) in enumerate([(20.0, 100.0), (30.0, 80.0), (25.0, 125.0)]):
        recall += [{**_row("fused", 1, f1_p50), "round": turn}, {**_row("fused", 8, f8_p50), "round": turn}]
        # A second service process' row of the same round is not the one-process ratio's.
        recall.append({**_row("fused", 8, 1.0), "round": turn, "services": 2})
    report = {"recall": recall, "direct_rounds": [_direct(40.0, 10.0, 2.0, 1.0) for _ in range(3)]}
    ratios = round_ratios(report)
    # qps = 1000 / p50 (the rows above): 10, 12.5 and 8 recalls/s against 40.
    assert [r["qps_ratio"] for r in ratios] == [0.25, 0.3125, 0.2]
    assert [r["p50_ratio"] for r in ratios] == [2.0, 3.0, 2.5]
    # fused CPU 1 + 2 + 3 = 6 ms against 2 + 1 ms direct.
    assert [r["cpu_ratio"] for r in ratios] == [2.0, 2.0, 2.0]
    assert [r["service_cpu_ms"] for r in ratios] == [1.0, 1.0, 1.0]
    line = summary_line({**report, "ratios": ratios})
    assert line == (
        "probe: rounds=3 qps_ratio=0.25 (0.20-0.31) p50_ratio=2.50 (2.00-3.00)"
        " cpu_ratio=2.00 (2.00-2.00) service_cpu_ms=1.00 (1.00-1.00)"
    )
    # A round missing a row its ratios need says so instead of guessing.
    short = {"recall": recall[:1], "direct_rounds": report["direct_rounds"][:1]}
    assert summary_line({**short, "ratios": round_ratios(short)}) == (
        "probe: rounds=1 qps_ratio=n/a p50_ratio=2.00 (2.00-2.00) cpu_ratio=n/a service_cpu_ms=n/a"
    )
    text = markdown(
        {
            **report,
            "ratios": ratios,
            "memories": 1,
            "session_rows": 1,
            "size": 1,
            "seed": 7,
            "direct": report["direct_rounds"][-1],
            "hnsw": None,
        },
        "cmd",
    )
    assert "| 1 | 0.31 | 3.00 | 2.00 | 1.00 |" in text
    assert line in text
