"""The Typesense keyword ranking: per-term searches scored by summed idf."""

from __future__ import annotations

import math

import numpy as np
import pytest

from indexers.typesense import idf_ranking, keyword_terms
from indexers.typesense.documents import vector_literal


def test_keyword_terms_drop_stopwords_and_normalise() -> None:
    assert keyword_terms('What did "Caroline" research, and when?') == ["caroline", "research"]
    assert keyword_terms("the the the") == ["the"]  # only stopwords: kept rather than nothing
    assert keyword_terms("a1 b2 c3 d4 e5 f6 g7 h8 i9 j10") == ["a1", "b2", "c3", "d4", "e5", "f6", "g7", "h8"]


def _result(found: int, *ids: str) -> dict:  # type: ignore[type-arg]
    return {"found": found, "hits": [{"document": {"memory_id": i}} for i in ids]}


def test_idf_ranking_prefers_rare_terms_and_sums_them() -> None:
    n = 100
    rare = _result(2, "b", "a")  # idf ln(1 + 98.5/2.5)
    common = _result(50, "c", "a", "d")  # idf ln(1 + 50.5/50.5) = ln 2
    assert idf_ranking([rare, common], n) == ["a", "b", "c", "d"]
    idf_rare = math.log(1 + 98.5 / 2.5)
    assert idf_rare > 2 * math.log(2)


def test_idf_ranking_ties_go_to_best_position_then_id() -> None:
    same = _result(10, "y", "x")
    other = _result(10, "z", "w")
    # Equal scores; (position, term index): y (0,0), z (0,1), x (1,0), w (1,1).
    assert idf_ranking([same, other], 50) == ["y", "z", "x", "w"]


def test_idf_ranking_empty() -> None:
    assert idf_ranking([], 0) == []
    assert idf_ranking([_result(0)], 10) == []


def test_the_vector_literal_reads_back_as_the_floats_it_was_given() -> None:
    rng = np.random.default_rng(11)
    for scale in (1e-40, 1e-7, 1e-5, 1.0, 1e5, 1e17):
        vector = (rng.standard_normal(384) * scale).astype(np.float32)
        vector[:3] = 0.0
        parsed = [float(x) for x in vector_literal(vector).split(",")]
        expected = [0.0 if abs(x) < 1.1754944e-38 else float(x) for x in vector.tolist()]
        assert parsed == expected
        assert vector_literal(vector.tolist()) == vector_literal(vector)
        assert vector_literal(iter(vector.tolist())) == vector_literal(vector)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_vector_literal_of_a_non_finite_component_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="NaN or infinite"):
        vector_literal([0.5, bad, 0.1])
