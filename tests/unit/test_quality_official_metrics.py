"""LongMemEval's official retrieval metrics and the rank helpers, on hand-made rankings."""

from __future__ import annotations

import math

import pytest

from benchmarks.quality.metrics import best_rank, dedupe, grow_cutoff, ndcg_any, recall_all, recall_any


def approx(value: float) -> object:
    return pytest.approx(value, rel=1e-12, abs=0.0)


RANKED = ["x", "a", "y", "b", "z", "c"]


def test_recall_any_and_all() -> None:
    gold = {"a", "b", "c"}
    assert recall_any(RANKED, gold, 1) == 0.0
    assert recall_any(RANKED, gold, 2) == 1.0
    assert recall_all(RANKED, gold, 5) == 0.0
    assert recall_all(RANKED, gold, 6) == 1.0
    assert recall_all(RANKED, gold, 50) == 1.0  # k beyond the list
    assert recall_any([], gold, 10) == 0.0


def test_no_gold_scores_any_0_all_1_ndcg_0() -> None:
    # The official code on a question whose gold turns are not indexed.
    assert recall_any(RANKED, set(), 10) == 0.0
    assert recall_all(RANKED, set(), 10) == 1.0
    assert ndcg_any(RANKED, set(), 10) == 0.0


def test_ndcg_any_counts_ranks_1_and_2_fully() -> None:
    # One gold item: at rank 1 or 2 it scores 1, at rank 3 1/log2(3), at rank 4 1/2.
    assert ndcg_any(["a", "x"], {"a"}, 10) == 1.0
    assert ndcg_any(["x", "a"], {"a"}, 10) == 1.0
    assert ndcg_any(["x", "y", "a"], {"a"}, 10) == approx(1 / math.log2(3))
    assert ndcg_any(["x", "y", "z", "a"], {"a"}, 10) == 0.5
    assert ndcg_any(["x", "y", "z", "a"], {"a"}, 3) == 0.0


def test_ndcg_any_several_gold() -> None:
    # Gold a, b, c at ranks 2, 4, 6: 1 + 1/2 + 1/log2(6); ideal ranks 1, 2, 3: 1 + 1 + 1/log2(3).
    assert ndcg_any(RANKED, {"a", "b", "c"}, 10) == approx((1 + 0.5 + 1 / math.log2(6)) / (2 + 1 / math.log2(3)))
    # k = 2 caps the ideal at two items: (0 + 1) / (1 + 1).
    assert ndcg_any(RANKED, {"a", "b", "c"}, 2) == 0.5


def test_ndcg_any_counts_every_position_and_takes_the_ideal_from_the_corpus() -> None:
    # Session labels repeated by their turns: each gold position counts, and the
    # ideal holds as many gold items as the corpus has (here 3 turns of session s1).
    labels = ["s1", "s2", "s1"]
    assert ndcg_any(labels, {"s1"}, 3, ideal_hits=3) == approx((1 + 1 / math.log2(3)) / (2 + 1 / math.log2(3)))
    assert ndcg_any(labels, {"s1"}, 3) == approx(1 + 1 / math.log2(3))  # ideal of one item: more than 1


def test_grow_cutoff_covers_k_distinct_labels() -> None:
    labels = ["s1", "s1", "s2", "s1", "s3", "s4"]
    assert grow_cutoff(labels, 1) == 1
    assert grow_cutoff(labels, 2) == 3
    assert grow_cutoff(labels, 3) == 5
    assert grow_cutoff(labels, 4) == 6
    # Fewer distinct labels than k: the whole list plus one, as the official loop ends.
    assert grow_cutoff(labels, 5) == 7
    assert grow_cutoff([], 5) == 5


def test_session_metrics_on_the_grown_prefix() -> None:
    labels = ["s1", "s1", "s2", "s1", "s3", "s4"]
    cut = grow_cutoff(labels, 3)  # 5: s1, s1, s2, s1, s3
    assert recall_any(labels, {"s3"}, cut) == 1.0
    assert recall_any(labels, {"s4"}, cut) == 0.0
    assert recall_all(labels, {"s2", "s3"}, cut) == 1.0


def test_best_rank_and_dedupe() -> None:
    assert best_rank(RANKED, {"b", "c"}) == 4.0
    assert best_rank(RANKED, {"q"}) == math.inf
    assert best_rank([], {"a"}) == math.inf
    assert dedupe(["s2", "s1", "s2", "s3", "s1"]) == ["s2", "s1", "s3"]
