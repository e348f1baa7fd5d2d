"""Evidence retrieval metrics: pure functions over ranked ids and a relevant set.

Relevance is binary. An id that appears more than once in a ranking counts
once, at its first (best) position, so a ranking cannot earn more than one
hit per relevant id.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence

__all__ = ["hit_ranks", "mean", "ndcg_at_k", "recall_at_k", "recall_curve"]


def hit_ranks(ranked: Sequence[str], relevant: Collection[str]) -> list[int]:
    """1-based ranks at which relevant ids first appear in ``ranked``."""
    seen: set[str] = set()
    ranks = []
    for rank, item in enumerate(ranked, start=1):
        if item in relevant and item not in seen:
            seen.add(item)
            ranks.append(rank)
    return ranks


def _check(relevant: Collection[str], k: int) -> None:
    if not relevant:
        raise ValueError("relevant set is empty: the metric is undefined")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")


def recall_at_k(ranked: Sequence[str], relevant: Collection[str], k: int) -> float:
    """Share of the relevant ids found among the first ``k`` of ``ranked``."""
    _check(relevant, k)
    return sum(1 for r in hit_ranks(ranked, relevant) if r <= k) / len(set(relevant))


def recall_curve(ranked: Sequence[str], relevant: Collection[str], max_k: int) -> list[float]:
    """``[recall@1, ..., recall@max_k]``."""
    return [recall_at_k(ranked, relevant, k) for k in range(1, max_k + 1)]


def ndcg_at_k(ranked: Sequence[str], relevant: Collection[str], k: int) -> float:
    """Binary nDCG@k: ``sum 1/log2(rank+1)`` over hits in the top k, divided by
    the same sum for an ideal ranking, which holds ``min(|relevant|, k)`` hits."""
    _check(relevant, k)
    dcg = sum(1.0 / math.log2(r + 1) for r in hit_ranks(ranked, relevant) if r <= k)
    ideal = sum(1.0 / math.log2(r + 1) for r in range(1, min(len(set(relevant)), k) + 1))
    return dcg / ideal


def mean(values: Iterable[float]) -> float:
    """Arithmetic mean; NaN for no values (a category with no questions)."""
    items = list(values)
    return math.fsum(items) / len(items) if items else math.nan
