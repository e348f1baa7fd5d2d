"""The LoCoMo quality benchmark's scoring functions, with hand-computed values."""

from __future__ import annotations

import math

import pytest

from benchmarks.quality.metrics import hit_ranks, mean, ndcg_at_k, recall_at_k, recall_curve


def approx(value: float) -> object:
    return pytest.approx(value, rel=1e-12, abs=0.0)


RANKED = ["a", "x", "b", "y", "z", "c"]


def test_hit_ranks_are_one_based_first_occurrences() -> None:
    assert hit_ranks(RANKED, {"a", "b", "c", "q"}) == [1, 3, 6]
    assert hit_ranks(["x", "a", "a", "b"], {"a", "b"}) == [2, 4]
    assert hit_ranks([], {"a"}) == []


def test_recall_at_k() -> None:
    relevant = {"a", "b", "c", "q"}
    assert recall_at_k(RANKED, relevant, 1) == 0.25
    assert recall_at_k(RANKED, relevant, 2) == 0.25
    assert recall_at_k(RANKED, relevant, 3) == 0.5
    assert recall_at_k(RANKED, relevant, 6) == 0.75
    assert recall_at_k(RANKED, relevant, 20) == 0.75  # k beyond the list
    assert recall_at_k(["x"], {"a"}, 5) == 0.0
    assert recall_at_k(["a", "a"], {"a", "b"}, 2) == 0.5  # a repeated id is one hit


def test_recall_curve() -> None:
    assert recall_curve(RANKED, {"a", "b", "c", "q"}, 7) == [0.25, 0.25, 0.5, 0.5, 0.5, 0.75, 0.75]


def test_ndcg_single_relevant() -> None:
    assert ndcg_at_k(["a"], {"a"}, 10) == 1.0
    assert ndcg_at_k(["x", "a"], {"a"}, 10) == approx(1 / math.log2(3))
    assert ndcg_at_k(["x", "y", "a"], {"a"}, 10) == 0.5  # 1/log2(4)
    assert ndcg_at_k(["x", "y", "a"], {"a"}, 2) == 0.0


def test_ndcg_several_relevant() -> None:
    # hits at ranks 1, 3, 6 of 4 relevant; ideal: ranks 1..4.
    dcg = 1 + 1 / 2 + 1 / math.log2(7)
    ideal = 1 + 1 / math.log2(3) + 1 / 2 + 1 / math.log2(5)
    assert ndcg_at_k(RANKED, {"a", "b", "c", "q"}, 10) == approx(dcg / ideal)
    # k=2 caps the ideal at two hits: (1) / (1 + 1/log2 3).
    assert ndcg_at_k(RANKED, {"a", "b", "c", "q"}, 2) == approx(1 / (1 + 1 / math.log2(3)))


def test_ndcg_ideal_uses_min_of_relevant_and_k() -> None:
    relevant = {f"r{i}" for i in range(12)}
    ranked = sorted(relevant)[:10]
    assert ndcg_at_k(ranked, relevant, 10) == 1.0
    assert ndcg_at_k(["b", "a"], {"a", "b"}, 10) == 1.0


def test_empty_relevant_and_bad_k_are_refused() -> None:
    with pytest.raises(ValueError, match=r"^relevant set is empty: the metric is undefined$"):
        recall_at_k(["a"], set(), 5)
    with pytest.raises(ValueError, match=r"^relevant set is empty: the metric is undefined$"):
        ndcg_at_k(["a"], set(), 5)
    with pytest.raises(ValueError, match=r"^k must be >= 1, got 0$"):
        recall_at_k(["a"], {"a"}, 0)


def test_mean() -> None:
    assert mean([0.25, 0.5, 1.0]) == approx(1.75 / 3)
    assert mean(iter([1.0])) == 1.0
    assert math.isnan(mean([]))
