"""The pure parts of the HNSW recall benchmark: recall, ef needed, exact top-k, plans."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.load.hnsw import (
    ef_needed,
    exact_top_k,
    plan_uses_index,
    plot_curves,
    recall_at_k,
)


def test_recall_counts_the_exact_top_k_found() -> None:
    assert recall_at_k(["a", "b", "c"], ["a", "b", "c"], k=3) == 1.0
    assert recall_at_k(["c", "b", "a"], ["a", "b", "c"], k=3) == 1.0  # order does not matter
    assert recall_at_k(["a", "x", "y", "b"], ["a", "b", "c", "d"], k=4) == 0.5
    assert recall_at_k(["x", "y"], ["a", "b"], k=2) == 0.0


def test_recall_looks_at_the_first_k_of_each_list_only() -> None:
    # "b" is in the approximate list but beyond k; "z" is in the exact list beyond k.
    assert recall_at_k(["a", "x", "b"], ["a", "b", "z"], k=2) == 0.5
    assert recall_at_k(list(range(10)) + [10], list(range(11)), k=10) == 1.0
    assert recall_at_k([3, 1, 4, 1, 5, 9, 2, 6, 5, 3], list(range(10)), k=10) == 0.7  # 3 1 4 5 9 2 6


def test_recall_duplicates_count_once_and_short_lists() -> None:
    assert recall_at_k(["a", "a", "a"], ["a", "b", "c"], k=3) == pytest.approx(1 / 3)
    # Fewer exact ids than k: the denominator is what exists.
    assert recall_at_k(["a"], ["a", "b"], k=10) == 0.5
    assert recall_at_k([], ["a", "b"], k=10) == 0.0


def test_recall_errors() -> None:
    with pytest.raises(ValueError, match=r"^k must be >= 1, got 0$"):
        recall_at_k(["a"], ["a"], k=0)
    with pytest.raises(ValueError, match=r"^exact_ids is empty: recall is undefined$"):
        recall_at_k(["a"], [], k=10)


def test_ef_needed_is_the_smallest_ef_reaching_the_target() -> None:
    curve = {64: 0.97, 10: 0.80, 32: 0.95, 16: 0.90, 128: 0.995}
    assert ef_needed(curve, 0.95) == 32
    assert ef_needed(curve, 0.96) == 64
    assert ef_needed(curve, 0.99) == 128
    assert ef_needed(curve, 0.5) == 10
    assert ef_needed(curve, 0.999) is None
    assert ef_needed({}, 0.95) is None


def test_ef_needed_takes_the_first_ef_even_if_a_larger_one_dips() -> None:
    assert ef_needed({10: 0.96, 16: 0.94, 24: 0.97}, 0.95) == 10


def test_ef_needed_absorbs_float_rounding_at_the_target() -> None:
    # A mean of per-query recalls can land a hair below the target it meets.
    assert ef_needed({40: 0.9499999999999999}, 0.95) == 40
    assert ef_needed({40: 0.9499}, 0.95) is None


def test_exact_top_k_by_cosine_nearest_first() -> None:
    vectors = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [2.0, 2.0], [1.0, 0.1]], dtype=np.float32)
    queries = np.array([[1.0, 0.0], [0.0, 3.0]], dtype=np.float32)
    # Cosine ignores length: [2, 2] is 45 degrees from both axes.
    assert exact_top_k(vectors, queries, 3).tolist() == [[0, 4, 3], [1, 3, 4]]
    assert exact_top_k(vectors, queries, 1).tolist() == [[0], [1]]
    # k beyond the rows: every row, in order.
    assert exact_top_k(vectors, queries[:1], 10).tolist() == [[0, 4, 3, 1, 2]]


def test_exact_top_k_breaks_ties_by_row_index() -> None:
    vectors = np.array([[0.0, 1.0], [1.0, 0.0], [0.0, -1.0], [1.0, 0.0]], dtype=np.float32)
    q = np.array([[0.0, 0.0001]]) + np.array([[1.0, -0.0001]])  # = [1, 0]
    assert exact_top_k(vectors, q, 2).tolist() == [[1, 3]]
    assert exact_top_k(vectors, q, 3).tolist() == [[1, 3, 0]]


def test_exact_top_k_matches_brute_force_on_random_data() -> None:
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((500, 24))
    queries = rng.standard_normal((300, 24))  # more than one chunk of 256
    x = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    expected = np.argsort(-(q @ x.T), axis=1)[:, :10]
    assert (exact_top_k(vectors, queries, 10) == expected).all()


def test_exact_top_k_rejects_k_below_one() -> None:
    with pytest.raises(ValueError, match=r"^k must be >= 1, got 0$"):
        exact_top_k(np.ones((2, 2)), np.ones((1, 2)), 0)


def test_plan_uses_index_finds_the_index_anywhere_in_the_plan() -> None:
    plan = [
        {
            "Plan": {
                "Node Type": "Sort",
                "Plans": [
                    {
                        "Node Type": "Limit",
                        "Plans": [{"Node Type": "Index Scan", "Index Name": "memories_hnsw_session"}],
                    }
                ],
            }
        }
    ]
    assert plan_uses_index(plan, "memories_hnsw_session")
    assert not plan_uses_index(plan, "memories_hnsw_rag")
    seq = [{"Plan": {"Node Type": "Limit", "Plans": [{"Node Type": "Seq Scan"}]}}]
    assert not plan_uses_index(seq, "memories_hnsw_session")


def test_plot_curves_writes_a_png_and_skips_skipped_tiers(tmp_path: Path) -> None:
    result = {
        "k": 10,
        "queries": 2,
        "tiers": {
            "session": {
                "m": 8,
                "ef_construction": 32,
                "ef_search": 32,
                "rows": 100,
                "recall": 0.9,
                "latency_p50_ms": 1.0,
                "curve": {10: 0.8, 32: 0.9, 64: 0.97},
                "latency_p50_ms_by_ef": {10: 0.5, 32: 1.0, 64: 1.6},
            },
            "entities": {"rows": 3, "skipped": "3 rows, fewer than k=10"},
        },
    }
    path = tmp_path / "out" / "hnsw.png"
    plot_curves(result, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
