"""The pure last step of a recall: source lists in, the ranked and budgeted answer out.

:func:`assemble` drops candidates below the confidence floor, fuses the
sources' lists with RRF, applies the query's factors, keeps the ``top_k``
best and packs them into the token-budgeted memory block. It does no I/O and
reads no config: everything it needs is an argument, so it is tested with
exact values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Generic, Protocol, TypeVar

import msgspec

from fusion.block import BlockItem, format_block
from fusion.factors import apply_factors
from fusion.query import QueryPlan
from fusion.rrf import rrf
from fusion.tokens import Encoding

__all__ = ["Assembly", "Candidate", "Ranked", "assemble"]


class Candidate(Protocol):
    """What fusion reads of a source's hit."""

    @property
    def id(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def content(self) -> str: ...
    @property
    def created_at(self) -> datetime: ...
    @property
    def confidence(self) -> float: ...
    @property
    def speaker(self) -> str | None: ...


C = TypeVar("C", bound=Candidate)


class Ranked(msgspec.Struct, Generic[C], frozen=True):
    """One item of the answer: ``score == rrf_score * product(factors.values())``,
    ``rrf_score == sum(contributions.values())``."""

    #: The first source list's hit for this id (sources are read in the order given).
    hit: C
    score: float
    rrf_score: float
    #: Every source of the recall: its 1-based rank of the id, or None.
    ranks: dict[str, int | None]
    contributions: dict[str, float]
    factors: dict[str, float]
    in_block: bool
    truncated: bool


class Assembly(msgspec.Struct, Generic[C], frozen=True):
    items: list[Ranked[C]]
    block: str
    tokens: int


def assemble(
    lists: Mapping[str, Sequence[C]],
    plan: QueryPlan,
    *,
    k: int,
    weights: Mapping[str, float],
    speaker_boost: float,
    time_boost: float,
    min_confidence: float,
    top_k: int,
    budget: int,
    encoding: Encoding,
) -> Assembly[C]:
    """Fuse ``lists`` (source name -> hits, best first) into the answer.

    A hit below ``min_confidence`` is dropped before ranks are counted. An id
    several sources return is one item; the hit shown is the first source's
    (in ``lists`` order). Ranks are 1-based, as :func:`fusion.rrf` counts them.
    """
    hits: dict[str, C] = {}
    rankings: dict[str, list[str]] = {}
    for name, found in lists.items():
        kept = [h for h in found if h.confidence >= min_confidence]
        rankings[name] = [h.id for h in kept]
        for h in kept:
            hits.setdefault(h.id, h)
    fused = rrf(rankings, k=k, weights={n: weights.get(n, 1.0) for n in rankings})
    ranked = apply_factors(
        fused,
        lambda id: (hits[id].speaker, hits[id].created_at),
        plan,
        speaker_boost=speaker_boost,
        time_boost=time_boost,
    )
    top = ranked[:top_k]
    block = format_block(
        [
            BlockItem(
                kind=hits[s.fused.id].kind,
                created_at=hits[s.fused.id].created_at,
                content=hits[s.fused.id].content,
                confidence=hits[s.fused.id].confidence,
            )
            for s in top
        ],
        budget,
        encoding,
    )
    included, truncated = set(block.included), set(block.truncated)
    items = [
        Ranked[C](
            hit=hits[s.fused.id],
            score=s.score,
            rrf_score=s.fused.score,
            ranks={n: s.fused.ranks.get(n) for n in lists},
            contributions=dict(s.fused.contributions),
            factors=s.factors,
            in_block=i in included,
            truncated=i in truncated,
        )
        for i, s in enumerate(top)
    ]
    return Assembly[C](items=items, block=block.text, tokens=block.tokens)
