"""The load report's issue-16 ratios, from a made-up run with round numbers."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.load.report import (
    MODEL_SUPPLIED,
    _cpu_table,
    _direct_table,
    _placement_row,
    _row_waits,
    summary_line,
    targets,
)


def _recall(clients: int, embedding: str, p50: float, qps: float, service: float) -> dict[str, Any]:
    cpu = {"service": service, "postgres": 10.0, "typesense": 20.0, "client": 0.5}
    return {
        "config": "fused",
        "clients": clients,
        "embedding": embedding,
        "p50": p50,
        "p99": 2 * p50,
        "qps": qps,
        "cpu_ms": cpu,
    }


def _report() -> dict[str, Any]:
    return {
        "size": 1000,
        "recall": [
            _recall(1, "supplied", 30.0, 33.0, 12.0),
            _recall(8, "supplied", 200.0, 40.0, 10.0),
            _recall(1, "text only, cold", 35.0, 28.0, 15.5),
            _recall(1, "text only, cached", 30.0, 33.0, 12.0),
        ],
        "direct": {
            "typesense": [
                {"clients": 1, "p50": 20.0, "qps": 50.0, "cpu_ms": {"typesense": 12.0, "client": 0.5}},
                {"clients": 8, "p50": 100.0, "qps": 80.0, "cpu_ms": {"typesense": 11.0, "client": 1.0, "service": 3.0}},
            ],
            "pgvector": [{"clients": 8, "p50": 5.0, "qps": 300.0, "cpu_ms": {"postgres": 4.0, "client": 1.0}}],
        },
        "freshness": {"50": {"typesense": {"p50": 10.0, "p99": 40.0}}},
        "drain": {"cpu_ms_per_memory": {"service": 1.0, "postgres": 2.0, "typesense": 2.0, "client": 0.1}},
        "raw_typesense": {"cpu_ms_per_doc": {"typesense": 1.5, "client": 0.1}},
        "raw_postgres": {"cpu_ms_per_row": {"postgres": 1.0, "client": 0.5}},
        "hnsw": {"tiers": {"session": {"recall@10": 0.97}}},
    }


def test_targets_are_the_issues_ratios_from_one_run() -> None:
    t = targets(_report())
    # Fused: service + Postgres + Typesense (not the load client); direct: backend + sender (not the service).
    assert t["fused_cpu_ms"] == 40.0
    assert t["direct_cpu_ms"] == 12.0 + 5.0
    assert t["cpu_ratio"] == pytest.approx(40.0 / 17.0)
    assert t["qps_ratio"] == 0.5
    assert t["direct_qps"] == 80.0
    assert t["p50_ratio"] == 1.5
    assert t["service_cpu_ms"] == 10.0
    assert t["cold_embedding_cpu_ms"] == 3.5
    assert t["cached_embedding_cpu_ms"] == 0.0
    assert t["freshness_p99_ms"] == 40.0
    assert t["write_cpu_ms"] == pytest.approx(5.1)
    assert t["raw_write_cpu_ms"] == pytest.approx(3.1)
    assert t["write_cpu_ratio"] == pytest.approx(5.1 / 3.1)


def test_freshness_with_nothing_probing_is_read_from_the_steady_row_beside_the_probed_one() -> None:
    from benchmarks.load.report import _steady_table, _targets_table

    report = _report()
    steady = {
        "writes": 500,
        "acked_per_s": 50.0,
        "ack_ms": {"n": 500, "p50": 17.0, "p99": 60.0},
        "outbox_ms": {"n": 500, "p50": 6.0, "p99": 39.0},
        "fresh_ms": {"n": 500, "p50": 5.0, "p99": 33.5},
        "drain_s": 0.2,
        "cpu_ms_per_write": {"service": 12.0, "postgres": 6.0, "typesense": 4.0, "client": 0.4},
        "errors": [],
        "error_count": 0,
    }
    report["steady"] = {"50": steady}
    t = targets(report)
    assert t["steady_fresh_p99_ms"] == 33.5
    assert t["freshness_p99_ms"] == 40.0  # the probed row's, still reported
    table = "\n".join(_targets_table(t))
    assert "| Typesense freshness p99 at 50 writes/s, nothing probing" in table
    assert "| 33.5 ms | ≤ 50 ms | yes |" in table
    assert "| 40.0 ms | ≤ 50 ms | yes |" in table
    assert "| 5.0 / 33.5 (500) |" in "\n".join(_steady_table(report["steady"]))
    # A report from before the figure: no value, and the table says so.
    del steady["fresh_ms"]
    assert "steady_fresh_p99_ms" not in targets(report)
    assert "| 6.0 / 39.0 (500) | – |" in "\n".join(_steady_table(report["steady"]))


def test_the_embedding_rows_are_read_against_the_row_searching_with_the_same_vectors() -> None:
    # The text-only rows search with the model's vectors for the texts: the
    # row that supplies those vectors is their base, not the corpus' row.
    report = _report()
    report["recall"].append(_recall(1, MODEL_SUPPLIED, 31.0, 32.0, 14.0))
    t = targets(report)
    assert t["embedding_base"] == MODEL_SUPPLIED
    assert t["cold_embedding_cpu_ms"] == 1.5
    assert t["cached_embedding_cpu_ms"] == -2.0
    assert t["p50_ratio"] == 1.5  # still the corpus' row against the direct multi_search
    assert targets(_report())["embedding_base"] == "supplied"


def test_the_last_line_carries_the_ratios() -> None:
    assert summary_line(_report()) == (
        "load: size=1000 p50_ms=200.0 p99_ms=400.0 qps=40 direct_qps=80 qps_ratio=0.50 p50_ratio=1.50 "
        "cpu_ratio=2.35 hnsw_recall=0.970"
    )


def test_a_run_without_8_clients_still_has_a_last_line() -> None:
    report = _report()
    report["recall"] = [r for r in report["recall"] if r["clients"] != 8]
    report["direct"] = {k: [r for r in rows if r["clients"] != 8] for k, rows in report["direct"].items()}
    line = summary_line(report)
    assert line.startswith("load: size=1000 p50_ms=n/a p99_ms=n/a qps=n/a ") and line.endswith("hnsw_recall=0.970")


def test_the_waits_between_recall_rows_are_reported() -> None:
    report = _report()
    assert _row_waits(report["recall"]) == []
    report["recall"][1]["quiet_before"] = {"seconds": 12.4, "idle": True}
    report["recall"][2]["quiet_before"] = {"seconds": 180.0, "idle": False}
    (_, line) = _row_waits(report["recall"])
    assert line.endswith("fused supplied 8: 12 s, fused text only, cold 1: 180 s (still busy).")


def test_a_report_from_before_the_metered_baselines_has_no_targets() -> None:
    old = {**_report(), "direct": {"typesense": {"n": 500, "p50": 20.0}, "pgvector": {"n": 500, "p50": 5.0}}}
    assert targets(old) == {}
    assert "direct_qps=– qps_ratio=– p50_ratio=– cpu_ratio=–" in summary_line(old)


def test_the_settle_row_says_whether_the_raw_baselines_ran_on_a_quiet_postgres() -> None:
    from benchmarks.load.report import _settle_row

    assert "no (older run)" in _settle_row(None)
    row = _settle_row({"seconds": 3.25, "autovacuum_workers": 2})
    assert "3.2 s" in row and "running when it began: 2" in row


def test_the_import_row_names_the_reserved_indexes_and_the_pair_and_is_absent_without_import() -> None:
    from benchmarks.load.report import _import_row

    assert _import_row(None) is None
    progress = {"import": {"tenant": "big", "reserved": ["session", "rag"], "typesense": {"alias": "mem__own_x"}}}
    row = _import_row({"seconds": 44.04, "progress": progress})
    assert row is not None
    assert "44.0 s" in row and "big/session, big/rag" in row and "mem__own_x" in row


def test_the_direct_baseline_names_a_keyword_only_search_when_typesense_holds_no_vectors() -> None:
    direct = _report()["direct"]
    for rows in (direct["typesense"], direct["pgvector"]):
        for r in rows:
            r.update(n=100, p99=2 * r["p50"])
    paired = "\n".join(_direct_table({**direct, "vector_collection": "braid_memories_vectors"}))
    alone = "\n".join(_direct_table({**direct, "vector_collection": None}))
    assert "| Typesense keyword + vector multi_search | 8 |" in paired
    assert "a vector search in `braid_memories_vectors`" in paired
    assert "| Typesense keyword multi_search (no vectors in Typesense) | 8 |" in alone
    assert "vector search in" not in alone


def test_the_placement_row_says_whether_the_typesense_stores_were_compacted() -> None:
    job: dict[str, Any] = {
        "seconds": 12.5,
        "progress": {"pgvector": {"indexes": []}, "placement": {"tenants": ["big"]}},
    }
    assert _placement_row(job) == (
        "| placement job after the load | 12.5 s; own HNSW indexes: none; Typesense pairs of their own: big |"
    )
    job["progress"]["compact"] = {"phase": "done", "nodes": {"http://a": "ok", "http://b": "ok"}, "seconds": 0.164}
    assert _placement_row(job).endswith("Typesense pairs of their own: big; Typesense stores compacted: ok (0.16 s) |")
    job["progress"]["compact"]["nodes"]["http://b"] = "HTTP 503: busy"
    assert "compacted: HTTP 503: busy, ok (0.16 s)" in _placement_row(job)


def test_the_cpu_table_shows_the_sessions_each_row_opened() -> None:
    rows = [{**_recall(32, "supplied", 400.0, 60.0, 11.0), "pg_sessions": 31}, _recall(8, "supplied", 100.0, 80.0, 9.0)]
    lines = [line for line in _cpu_table(rows) if line.startswith("| fused")]
    assert lines[0].endswith("| 31 |") and "| 11.00 | 10.00 | 20.00 | 0.50 | 41.50 |" in lines[0]
    # A run from before the column (its rows have no count) shows none.
    assert lines[1].endswith("| - |")
