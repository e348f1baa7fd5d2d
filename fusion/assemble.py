"""The pure last step of a recall: source lists in, the ranked and budgeted answer out.

:func:`rank` drops candidates below the confidence floor, fuses the
sources' lists with RRF and applies the query, recency and importance
factors; :meth:`Ranking.usage_ids` names the few candidates whose recall
counts could still change the top; :meth:`Ranking.finish` applies those
counts, keeps the ``top_k`` best and packs them into the token-budgeted
memory block. :func:`assemble` does both at once. Nothing here does I/O or
reads config: everything is an argument, so it is tested with exact values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, Protocol, TypeVar

import msgspec
import numpy as np

from fusion.block import BlockItem, format_block
from fusion.factors import (
    FactorWeights,
    Scored,
    apply_factors,
    restate,
    restatement_candidates,
    usage_candidates,
    with_usage,
)
from fusion.query import QueryPlan
from fusion.rrf import rrf
from fusion.tokens import Encoding

__all__ = ["Assembly", "Candidate", "Ranked", "Ranking", "assemble", "rank"]


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
    @property
    def importance(self) -> float | None: ...


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


@dataclass(frozen=True)
class Ranking(Generic[C]):
    """Every fused candidate, scored by all factors but usage, best first."""

    #: The source names, in the order their lists were given.
    sources: tuple[str, ...]
    hits: Mapping[str, C]
    scored: Sequence[Scored]
    factors: FactorWeights
    #: The query asks how things stand now (:attr:`fusion.query.QueryPlan.current`).
    current: bool = False

    def usage_ids(self, top_k: int) -> list[str]:
        """The ids whose recall counts :meth:`finish` needs (empty when usage is off)."""
        return usage_candidates(self.scored, top_k, self.factors)

    def restatement_ids(self, usage: Mapping[str, int]) -> list[str]:
        """The ids whose embeddings :meth:`finish` needs once the recall counts
        ``usage`` are applied (empty when the restatement factor is off)."""
        if not self.factors.restatement_similarity:
            return []
        return restatement_candidates(with_usage(self.scored, usage, self.factors), self.current, self.factors)

    def finish(
        self,
        *,
        usage: Mapping[str, int],
        top_k: int,
        budget: int,
        encoding: Encoding,
        vectors: Mapping[str, np.ndarray] | None = None,
    ) -> Assembly[C]:
        """Apply the recall counts ``usage`` (id -> count) and the restatement
        factor (with the embeddings ``vectors`` of :meth:`restatement_ids`),
        keep the ``top_k`` best and pack them into a block of at most
        ``budget`` tokens."""
        hits = self.hits
        ranked = with_usage(self.scored, usage, self.factors)
        if vectors:
            ranked = restate(
                ranked,
                {id: h.created_at for id, h in hits.items()},
                vectors,
                self.factors,
                {id: h.content for id, h in hits.items()},
                {id: h.speaker for id, h in hits.items()},
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
        # Ranked(...), not Ranked[C](...): a subscripted generic's call goes
        # through typing's __call__, several microseconds an item.
        items = [
            Ranked(
                hit=hits[s.fused.id],
                score=s.score,
                rrf_score=s.fused.score,
                ranks={n: s.fused.ranks.get(n) for n in self.sources},
                contributions=dict(s.fused.contributions),
                factors=s.factors,
                in_block=i in included,
                truncated=i in truncated,
            )
            for i, s in enumerate(top)
        ]
        return Assembly(items=items, block=block.text, tokens=block.tokens)


def rank(
    lists: Mapping[str, Sequence[C]],
    plan: QueryPlan,
    *,
    k: int,
    weights: Mapping[str, float],
    factors: FactorWeights,
    reference_time: datetime,
    min_confidence: float,
) -> Ranking[C]:
    """Fuse ``lists`` (source name -> hits, best first) and score the candidates.

    A hit below ``min_confidence`` is dropped before ranks are counted. An id
    several sources return is one item; the hit shown is the first source's
    (in ``lists`` order). Ranks are 1-based, as :func:`fusion.rrf` counts them.
    ``reference_time`` is "now" for the recency factor.
    """
    hits: dict[str, C] = {}
    rankings: dict[str, list[str]] = {}
    for name, found in lists.items():
        kept = [h for h in found if h.confidence >= min_confidence]
        rankings[name] = [h.id for h in kept]
        for h in kept:
            hits.setdefault(h.id, h)
    fused = rrf(rankings, k=k, weights={n: weights.get(n, 1.0) for n in rankings})
    memory = {id: (h.speaker, h.created_at, h.importance) for id, h in hits.items()}
    scored = apply_factors(fused, memory, plan, factors, reference_time)
    return Ranking(tuple(lists), hits, scored, factors, plan.current)


def assemble(
    lists: Mapping[str, Sequence[C]],
    plan: QueryPlan,
    *,
    k: int,
    weights: Mapping[str, float],
    factors: FactorWeights,
    reference_time: datetime,
    min_confidence: float,
    top_k: int,
    budget: int,
    encoding: Encoding,
    usage: Mapping[str, int] | None = None,
    vectors: Mapping[str, np.ndarray] | None = None,
) -> Assembly[C]:
    """:func:`rank` then :meth:`Ranking.finish`, with recall counts ``usage``
    and embeddings ``vectors`` (default none)."""
    ranking = rank(
        lists, plan, k=k, weights=weights, factors=factors, reference_time=reference_time, min_confidence=min_confidence
    )
    return ranking.finish(usage=usage or {}, top_k=top_k, budget=budget, encoding=encoding, vectors=vectors)
