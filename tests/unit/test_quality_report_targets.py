"""The LoCoMo report's target lines (issue 17's, then the earlier floors)."""

from __future__ import annotations

from typing import Any

from benchmarks.quality.report import targets


def _report(fused: float, typesense: float, graph: float | None) -> dict[str, Any]:
    def config(r10: float) -> dict[str, Any]:
        return {"overall": {"R@10": r10, "nDCG@10": 0.6}, "by_category": {}}

    configs = {"typesense": config(typesense), "pgvector": config(0.70), "fused": config(fused)}
    if graph is not None:
        configs["graph"] = config(graph)
    return {"configs": configs}


def test_issue_17_targets_pass_and_fail_on_their_bounds() -> None:
    assert targets(_report(0.80, 0.77, 0.60))[:3] == [
        (True, "fused R@10 0.800 >= 0.800"),
        (True, "fused R@10 0.800 >= best single (typesense) 0.770 + 0.03"),
        (True, "graph R@10 0.600 >= 0.600"),
    ]
    assert [passed for passed, _ in targets(_report(0.79, 0.77, 0.59))[:3]] == [False, False, False]


def test_a_run_without_the_graph_leaves_its_target_unchecked() -> None:
    assert targets(_report(0.81, 0.75, None))[2] == (None, "graph R@10 – >= 0.600")
