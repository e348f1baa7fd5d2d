"""Evidence retrieval metrics: pure functions over ranked ids and a relevant set.

Relevance is binary. For :func:`hit_ranks`, :func:`recall_at_k`,
:func:`ndcg_at_k` and :func:`best_rank` an id that appears more than once in
a ranking counts once, at its first (best) position, so a ranking cannot earn
more than one hit per relevant id.

:func:`recall_any`, :func:`recall_all`, :func:`ndcg_any` and
:func:`grow_cutoff` are LongMemEval's official metrics
(``src/retrieval/eval_utils.py``, restated in its README): there every
position of a ranking counts, so a session label repeated by several of its
turns scores at each of them.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence

__all__ = [
    "best_rank",
    "dedupe",
    "grow_cutoff",
    "hit_ranks",
    "mean",
    "ndcg_any",
    "ndcg_at_k",
    "recall_all",
    "recall_any",
    "recall_at_k",
    "recall_curve",
]


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


def best_rank(ranked: Sequence[str], ids: Collection[str]) -> float:
    """1-based rank of the first of ``ids`` in ``ranked``; ``inf`` if none is there."""
    return next((float(rank) for rank, item in enumerate(ranked, start=1) if item in ids), math.inf)


def dedupe(ranked: Iterable[str]) -> list[str]:
    """``ranked`` with each id kept at its first (best) position."""
    return list(dict.fromkeys(ranked))


def recall_any(ranked: Sequence[str], gold: Collection[str], k: int) -> float:
    """1.0 if some gold id is among the first ``k``, else 0.0 (0.0 with no gold)."""
    top = set(ranked[:k])
    return float(any(g in top for g in gold))


def recall_all(ranked: Sequence[str], gold: Collection[str], k: int) -> float:
    """1.0 if every gold id is among the first ``k``, else 0.0 (1.0 with no gold)."""
    top = set(ranked[:k])
    return float(all(g in top for g in gold))


def _dcg_any(gains: Sequence[int]) -> float:
    """Ranks 1 and 2 count fully, rank r >= 2 by ``1/log2(r)``."""
    return float(sum(g / math.log2(max(rank, 2)) for rank, g in enumerate(gains, start=1)))


def ndcg_any(ranked: Sequence[str], gold: Collection[str], k: int, ideal_hits: int | None = None) -> float:
    """LongMemEval's nDCG@k: binary gains over the first ``k`` positions (every
    position whose id is gold counts), over the same sum for the ideal order,
    which holds ``min(ideal_hits, k)`` gold items; 0.0 when that is none.

    ``ideal_hits`` is how many items of the whole corpus are gold (default
    ``len(gold)``); a corpus whose items share labels counts each item.
    """
    ideal = _dcg_any([1] * min(len(gold) if ideal_hits is None else ideal_hits, k))
    if ideal == 0:
        return 0.0
    return _dcg_any([1 if item in gold else 0 for item in ranked[:k]]) / ideal


def grow_cutoff(labels: Sequence[str], k: int) -> int:
    """The shortest prefix of ``labels`` holding ``k`` distinct ones (at least
    ``k``; the whole list plus one when it holds fewer, as the official loop
    ends): LongMemEval's session cutoff over a turn ranking."""
    cutoff = k
    while cutoff <= len(labels) and len(set(labels[:cutoff])) < k:
        cutoff += 1
    return cutoff


def mean(values: Iterable[float]) -> float:
    """Arithmetic mean; NaN for no values (a category with no questions)."""
    items = list(values)
    return math.fsum(items) / len(items) if items else math.nan
