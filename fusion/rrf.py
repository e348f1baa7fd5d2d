"""Weighted Reciprocal Rank Fusion on ids.

Each source hands over its ids best first; an id at rank ``r`` (1-based) in
source ``s`` earns ``w_s / (k + r)`` and its fused score is the sum over the
sources that returned it (Cormack et al., 2009, with per-source weights).

The same function fuses the search sources (``sources.<name>.weight``) and,
inside the Typesense source, its keyword and vector lists
(``rrf.vectorWeight``). Documents are re-attached to the ids by the caller.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import msgspec

__all__ = ["Fused", "rrf", "rrf_one"]


class Fused(msgspec.Struct, frozen=True):
    """One fused id. ``ranks`` and ``contributions`` name only the sources
    that returned the id; a contribution is ``w_s / (k + rank_s)``."""

    id: str
    score: float
    ranks: dict[str, int]
    contributions: dict[str, float]


def rrf(
    rankings: Mapping[str, Sequence[str]],
    *,
    k: int = 60,
    weights: Mapping[str, float] | None = None,
) -> list[Fused]:
    """Fuse ranked id lists, keyed by source name, into one ranking.

    A source missing from ``weights`` has weight 1.0. An id listed twice by a
    source counts at its best (first) rank only; ranks are positions in the
    list as given. A weight-0 source still reports its ranks but adds nothing.

    The result is ordered by score descending, then by the id's best rank over
    all sources ascending, then by id, so equal inputs give equal outputs.
    """
    weights = weights or {}
    _check(k, weights)

    ranks: dict[str, dict[str, int]] = {}
    for source, ids in rankings.items():
        for position, id_ in enumerate(ids, start=1):
            by_source = ranks.get(id_)
            if by_source is None:
                ranks[id_] = {source: position}
            elif source not in by_source:
                by_source[source] = position

    weight_of = {s: weights.get(s, 1.0) for s in rankings}
    fused: list[Fused] = []
    for id_, by_source in ranks.items():
        contributions = {s: weight_of[s] / (k + r) for s, r in by_source.items()}
        # fsum is correctly rounded, so the score does not depend on the order
        # of the terms and equal rank patterns give exactly equal scores. So is
        # one IEEE addition: for one or two terms it is fsum's number.
        if len(contributions) == 1:
            (score,) = contributions.values()
        elif len(contributions) == 2:
            first, second = contributions.values()
            score = first + second
        else:
            score = math.fsum(contributions.values())
        fused.append(Fused(id=id_, score=score, ranks=by_source, contributions=contributions))
    fused.sort(key=lambda f: (-f.score, min(f.ranks.values()), f.id))
    return fused


def rrf_one(
    ids: Sequence[str], *, k: int = 60, weight: float = 1.0, limit: int | None = None
) -> list[tuple[str, float]]:
    """:func:`rrf` of one list, as ``(id, score)`` pairs: the same ids in the
    same order with the same scores (``weight / (k + rank)``, an id listed
    twice at its first rank), at most ``limit`` of them, without building a
    :class:`Fused` for each."""
    _check(k, {"the list": weight})
    wanted = len(ids) if limit is None else limit
    seen: set[str] = set()
    out: list[tuple[str, float]] = []
    # Ranks only grow down the list, so its order is RRF's: scores fall with
    # the rank (or all tie at weight 0 and go by rank).
    for position, id_ in enumerate(ids, start=1):
        if len(out) >= wanted:
            break
        if id_ not in seen:
            seen.add(id_)
            out.append((id_, weight / (k + position)))
    return out


def _check(k: int, weights: Mapping[str, float]) -> None:
    """A :class:`ValueError` unless ``k`` is at least 1 and every weight finite and >= 0."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k!r}")
    for source, weight in weights.items():
        if not (math.isfinite(weight) and weight >= 0):
            raise ValueError(f"weight of source {source!r} must be finite and >= 0, got {weight!r}")
