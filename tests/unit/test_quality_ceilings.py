"""The quality benchmarks' ceilings: the oracle and the union of the top-10s, exact."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.quality.ceilings import locomo_ceilings, oracle_rankings, suite_ceilings, union_rankings


def test_union_interleaves_the_top_tens_each_id_once() -> None:
    per_source = {
        "typesense": [["a", "b", "c"]],
        "pgvector": [["b", "d"]],
        "graph": [["e"] + [f"g{i}" for i in range(12)]],
    }
    (union,) = union_rankings(per_source)
    assert union[:6] == ["a", "b", "e", "d", "g0", "c"]
    assert len(union) == 4 + 10  # a, b, c, d and the graph's first ten
    assert "g9" not in union and "g8" in union


def test_oracle_takes_the_best_source_per_question_first_on_ties() -> None:
    per_source = {"typesense": [["t1"], ["t2"]], "pgvector": [["p1"], ["p2"]], "graph": [["g1"], ["g2"]]}
    keys = {"typesense": [0.5, 1.0], "pgvector": [1.0, 1.0], "graph": [0.0, 0.5]}
    assert oracle_rankings(per_source, keys) == [["p1"], ["t2"]]


def test_locomo_ceilings() -> None:
    evidence = [frozenset({"x", "y"}), frozenset({"z"})]
    per_source = {
        "typesense": [["x", "n"], ["n"]],
        "pgvector": [["y", "n"], ["n"]],
        "graph": [["n"], ["n"] * 10 + ["z"]],
    }
    # Oracle: 0.5 then 0 (z is 11th in the graph); union: x and y, then no z in the top-10s.
    assert locomo_ceilings(evidence, per_source) == {"oracle R@10": 0.25, "union R@10": 0.5}


def test_suite_ceilings_score_the_oracle_and_the_union_with_the_suite() -> None:
    gold = [{"a"}, {"b", "c"}]

    def score(rankings: Any) -> dict[str, Any]:
        rows = [
            {
                "turn all@10": float(g <= set(r[:10])),
                "turn any@10": float(bool(g & set(r[:10]))),
                "turn ndcg@10": 0.0,
                "turn all@50": float(g <= set(r[:50])),
                "turn any@50": float(bool(g & set(r[:50]))),
            }
            for g, r in zip(gold, rankings, strict=True)
        ]
        overall = {m: sum(row[m] for row in rows) / len(rows) for m in rows[0]}
        return {"overall": overall, "by_kind": {}, "per_question": dict(enumerate(rows))}

    per_source = {"typesense": [["a"], ["b"]], "pgvector": [["x"], ["c"]], "graph": [["y"], ["b", "c"]]}
    out = suite_ceilings("longmemeval", score, per_source)
    assert out["oracle"]["overall"]["turn all@10"] == 1.0  # typesense, then the graph
    assert out["union"] == {"turn all@10": 1.0, "turn any@10": 1.0}
    per_source["graph"] = [["y"], ["z"]]
    out = suite_ceilings("longmemeval", score, per_source)
    assert out["oracle"]["overall"]["turn all@10"] == pytest.approx(0.5)
    assert out["union"]["turn all@10"] == 1.0  # b from typesense, c from pgvector
