"""What fusion could reach with the lists the sources return: two ceilings.

- **oracle**: for each question, the single source whose list scores best
  (an oracle picking the source per question), scored as a whole;
- **union**: the union of the sources' top-10s (up to 30 memories) as one
  list, as if a perfect re-ranking put every relevant memory among them at
  the top: the most a fusion of these top-10s could find.

The gap between the fused list and these is what fusion leaves on the table;
the gap between the best single source and the union is what the sources
add to one another (they differ; if they all found the same memories the
union would be no better than one of them). Pure functions over rankings.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .metrics import dedupe, mean, recall_at_k

__all__ = ["SINGLE", "TOP", "locomo_ceilings", "oracle_rankings", "suite_ceilings", "union_rankings"]

#: The sources a ceiling is built from.
SINGLE = ("typesense", "pgvector", "graph")
#: Each source's list that goes into the union.
TOP = 10


def union_rankings(per_source: Mapping[str, Sequence[Sequence[str]]], top: int = TOP) -> list[list[str]]:
    """Per question, the sources' first ``top`` ids, interleaved (each
    source's first, then each one's second, ...), each id once."""
    lists = [per_source[s] for s in SINGLE if s in per_source]
    out = []
    for ranked in zip(*lists, strict=True):
        out.append(dedupe(x for rank in itertools.zip_longest(*(r[:top] for r in ranked)) for x in rank if x))
    return out


def oracle_rankings(
    per_source: Mapping[str, Sequence[Sequence[str]]], keys: Mapping[str, Sequence[Any]]
) -> list[list[str]]:
    """Per question ``i``, the ranking of the source with the greatest
    ``keys[source][i]`` (of tied sources, the first in :data:`SINGLE` order)."""
    names = [s for s in SINGLE if s in per_source]
    n = len(per_source[names[0]]) if names else 0
    return [list(per_source[max(names, key=lambda s, i=i: (keys[s][i], -names.index(s)))][i]) for i in range(n)]


def locomo_ceilings(
    evidence: Sequence[frozenset[str]], per_source: Mapping[str, Sequence[Sequence[str]]]
) -> dict[str, float]:
    """LoCoMo's: the oracle's R@10 (ties keep the first source) and the union
    of the top-10s' recall (R over up to 30 ids)."""
    keys = {
        s: [recall_at_k(r, e, TOP) for r, e in zip(ranked, evidence, strict=True)] for s, ranked in per_source.items()
    }
    oracle = oracle_rankings(per_source, keys)
    union = union_rankings(per_source)
    return {
        "oracle R@10": mean(recall_at_k(r, e, TOP) for r, e in zip(oracle, evidence, strict=True)),
        "union R@10": mean(recall_at_k(r, e, len(SINGLE) * TOP) for r, e in zip(union, evidence, strict=True)),
    }


#: Per suite: the per-question figures the oracle picks a source by, in order
#: (a figure a question does not have counts 0), and the figures of the union
#: list that measure it whole (its up to 30 memories fit in them).
ORACLE_KEYS: dict[str, tuple[str, ...]] = {
    "longmemeval": ("turn all@10", "turn any@10", "turn ndcg@10"),
    "beam": ("pass", "new@10", "new_above_old", "both@10", "all@10", "any@10"),
}
UNION_FIGURES: dict[str, dict[str, str]] = {
    "longmemeval": {"turn all@10": "turn all@50", "turn any@10": "turn any@50"},
}


def suite_ceilings(
    name: str,
    score: Callable[[Sequence[Sequence[str]]], dict[str, Any]],
    per_source: Mapping[str, Sequence[Sequence[str]]],
) -> dict[str, Any]:
    """A suite's ceilings: ``oracle`` (the suite's ``score`` of the oracle's
    rankings, its ``overall`` and ``by_kind``) and ``union`` (the union's
    figures named in :data:`UNION_FIGURES`, under the figure at 10 they
    bound; none for a suite whose figures rank memories against each other)."""
    order = ORACLE_KEYS[name]
    keys = {
        s: [tuple(q.get(m, 0.0) for m in order) for q in score(ranked)["per_question"].values()]
        for s, ranked in per_source.items()
    }
    oracle = score(oracle_rankings(per_source, keys))
    union = score(union_rankings(per_source))["overall"]
    return {
        "oracle": {"overall": oracle["overall"], "by_kind": oracle["by_kind"]},
        "union": {at10: union[whole] for at10, whole in UNION_FIGURES.get(name, {}).items()},
    }
