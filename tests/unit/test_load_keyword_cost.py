"""The keyword-cost benchmark's pure parts: roles of searches and the report."""

from __future__ import annotations

from benchmarks.load.keyword_cost import _roles, markdown, role_of


def test_searches_are_told_apart_by_what_they_ask() -> None:
    assert role_of({"q": "*", "per_page": 0, "facet_by": "length,context_length"}) == "stats"
    assert role_of({"q": "*", "per_page": 0, "filter_by": "tenant_terms:=[`kx`]"}) == "count"
    assert role_of({"q": "*", "per_page": 150, "filter_by": "tenant_terms:=[`kx`]"}) == "candidates"


def test_roles_sum_search_time_per_recall_and_the_report_shows_them() -> None:
    calls = [
        (
            [{"per_page": 0}, {"per_page": 150}],
            [{"search_time_ms": 4, "found": 10}, {"search_time_ms": 20, "found": 9}],
        ),
        ([{"per_page": 150}], [{"search_time_ms": 30, "found": 7}]),
    ]
    roles = _roles(calls, recalls=2)
    assert roles["count"] == {"searches": 1, "search_ms_p50": 4.0, "search_ms_per_recall": 2.0, "found_p50": 10}
    assert roles["candidates"]["search_ms_p50"] == 25.0 and roles["candidates"]["search_ms_per_recall"] == 25.0
    report = {
        "alias": "a",
        "documents": 5,
        "queries": 2,
        "phases": {"warm": {"n": 2, "typesense_cpu_ms": 1.5, "wall_ms": 2.0, "multi_searches": 2, "roles": roles}},
    }
    assert "`typesense.vectors`: not recorded" in markdown(report, "cmd")
    report["vectors"] = "separate"
    text = markdown(report, "cmd")
    assert "`typesense.vectors`: separate" in text
    assert "| warm | 2 | 1.50 | 2.00 | 2 | count: 1, 4.0, 2.0, 10; candidates: 2, 25.0, 25.0, 8 |" in text
