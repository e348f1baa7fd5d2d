"""benchmarks.quality.ceilings: the oracle and the union of the top-10s, by hand."""

from __future__ import annotations

import pytest

from benchmarks.quality.ceilings import ceilings

# Two questions. q1: one evidence item, typesense rank 3, graph rank 12.
# q2: two items; typesense finds a at 1, pgvector finds b at 2, graph finds a at 4.
REPORT = {
    "questions": [
        {
            "evidence": ["x"],
            "hit_ranks": {"typesense": [3], "pgvector": [], "graph": [12], "fused": [2]},
            "item_ranks": {"typesense": [3], "pgvector": [None], "graph": [12], "fused": [2]},
        },
        {
            "evidence": ["a", "b"],
            "hit_ranks": {"typesense": [1], "pgvector": [2], "graph": [4], "fused": [1, 5]},
            "item_ranks": {"typesense": [1, None], "pgvector": [None, 2], "graph": [4, None], "fused": [1, 5]},
        },
    ]
}


def test_exact_with_item_ranks() -> None:
    c = ceilings(REPORT)
    assert c["fused"] == pytest.approx((1 + 1) / 2)
    assert c["typesense"] == pytest.approx((1 + 0.5) / 2)
    assert c["oracle"] == pytest.approx((1 + 0.5) / 2)
    assert c["union"] == c["union_high"] == pytest.approx((1 + 1) / 2)
    # q1: only typesense; q2: b only by pgvector, a by typesense and graph.
    assert c["only typesense"] == pytest.approx(0.5)
    assert c["only pgvector"] == pytest.approx(0.25)
    assert c["only graph"] == pytest.approx(0.0)


def test_bounds_without_item_ranks() -> None:
    old = {"questions": [{k: v for k, v in q.items() if k != "item_ranks"} for q in REPORT["questions"]]}
    c = ceilings(old)
    assert c["union"] == pytest.approx((1 + 0.5) / 2)  # the best source's count
    assert c["union_high"] == pytest.approx((1 + 1) / 2)  # the sum, capped
    assert c["only graph"] is None
