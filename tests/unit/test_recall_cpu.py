"""The in-process recall CPU benchmark's report: its rows and last line."""

from __future__ import annotations

from benchmarks.recall_cpu import markdown, summary_line


def _report() -> dict[str, object]:
    def row(config: str, own: float) -> dict[str, object]:
        return {"config": config, "cpu_ms": {"client": own, "postgres": 1.5, "typesense": 0.25}, "wall_ms": 9.0}

    return {
        "memories": 10000,
        "recalls": 500,
        "rows": [row("fused", 7.13), row("typesense", 4.28), row("pgvector", 1.6), row("graph", 2.56)],
    }


def test_each_row_shows_this_process_and_the_backends_cpu() -> None:
    text = markdown(_report(), "python -m benchmarks.recall_cpu <home>")
    assert text.startswith("# The recall path's CPU without HTTP: 10000 memories in the big tenant")
    # A report from before round trips were counted shows `-` for them.
    assert "| fused | 7.13 | 1.50 | 0.25 | 9.00 | - |" in text
    assert "| graph | 2.56 | 1.50 | 0.25 | 9.00 | - |" in text
    assert "cProfile" not in text


def test_the_profile_is_shown_only_when_taken_and_the_last_line_has_each_row() -> None:
    report = {**_report(), "profile": "  ncalls  tottime\n  500  0.180  pagerank\n"}
    assert "```\nncalls  tottime\n  500  0.180  pagerank\n```" in markdown(report, "x")
    assert summary_line(_report()) == (
        "recall-cpu: memories=10000 fused_ms=7.13 typesense_ms=4.28 pgvector_ms=1.60 graph_ms=2.56"
    )


def test_the_recalls_through_the_service_get_their_own_table_and_figure() -> None:
    cpu = {"service": 7.32, "postgres": 3.82, "typesense": 6.76, "client": 0.2}
    report = {**_report(), "http": {"cpu_ms": cpu, "wall_ms": 12.5}}
    assert "| fused, through the service | 7.32 | 3.82 | 6.76 | 0.20 | 12.50 |" in markdown(report, "x")
    assert summary_line(report).endswith("graph_ms=2.56 service_http_ms=7.32")
    assert "through the service" not in markdown(_report(), "x")


def test_each_row_shows_the_postgres_round_trips_of_a_recall() -> None:
    report = _report()
    rows = report["rows"]
    assert isinstance(rows, list)
    report["rows"] = [{**r, "round_trips": t} for r, t in zip(rows, (4.02, 1.0, 1.0, 1.5), strict=True)]
    text = markdown(report, "x")
    assert "| fused | 7.13 | 1.50 | 0.25 | 9.00 | 4.02 |" in text
    assert "| graph | 2.56 | 1.50 | 0.25 | 9.00 | 1.50 |" in text
    assert "`Postgres round trips`" in text


def test_the_round_trips_alone_get_their_own_table() -> None:
    trips = [
        {"trip": "scope + 1 statement", "cpu_ms": {"client": 0.1234, "postgres": 0.02}},
        {"trip": "generation alone (unscoped)", "cpu_ms": {"client": 0.09, "postgres": 0.025}},
    ]
    text = markdown({**_report(), "trips": trips}, "x")
    assert "| scope + 1 statement | 0.123 | 0.020 |" in text
    assert "| generation alone (unscoped) | 0.090 | 0.025 |" in text
    assert "One Postgres round trip alone" not in markdown(_report(), "x")
