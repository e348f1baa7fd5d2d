"""Factors applied to a fused RRF score after fusion.

A factor multiplies the score of a memory that matches the structure the
query named (:mod:`fusion.query`): ``speaker`` when the memory's speaker is
one the query names, ``time`` when the memory was created on a day inside a
date range the query names. Each is ``1 + boost``; a boost of 0 turns it
off. The recall response lists the factors applied to each item, so
``score == rrf_score * product(factors)`` can be checked by the caller.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import date, datetime

import msgspec

from fusion.query import QueryPlan
from fusion.rrf import Fused

__all__ = ["Scored", "apply_factors", "score_factors"]


class Scored(msgspec.Struct, frozen=True):
    """A fused id with its factors: ``score == fused.score * product(factors)``."""

    fused: Fused
    factors: dict[str, float]
    score: float


def score_factors(
    *,
    speaker: str | None,
    created_at: datetime,
    speakers: Sequence[str],
    dates: Sequence[tuple[date, date]],
    speaker_boost: float,
    time_boost: float,
) -> dict[str, float]:
    """The factors a memory earns; empty when none applies.

    Speakers match case-insensitively; ``created_at`` is compared by its
    calendar day (in the zone it carries; Braid stores UTC).
    """
    for name, boost in (("speaker_boost", speaker_boost), ("time_boost", time_boost)):
        if not (math.isfinite(boost) and boost >= 0):
            raise ValueError(f"{name} must be finite and >= 0, got {boost!r}")
    factors: dict[str, float] = {}
    if speaker_boost and speaker is not None:
        wanted = {s.casefold() for s in speakers}
        if speaker.casefold() in wanted:
            factors["speaker"] = 1.0 + speaker_boost
    if time_boost and dates:
        day = created_at.date()
        if any(first <= day <= last for first, last in dates):
            factors["time"] = 1.0 + time_boost
    return factors


def apply_factors(
    fused: Sequence[Fused],
    memory: Callable[[str], tuple[str | None, datetime]],
    plan: QueryPlan,
    *,
    speaker_boost: float,
    time_boost: float,
) -> list[Scored]:
    """Every fused candidate with its factors, best first.

    ``memory(id)`` gives the memory's ``(speaker, created_at)``. Applied to
    every candidate, not just the top, so a boosted memory from deep in a list
    can still reach the top. Ties go to the best single rank, then the id, as
    in :func:`fusion.rrf`.
    """
    scored = []
    for f in fused:
        speaker, created_at = memory(f.id)
        factors = score_factors(
            speaker=speaker,
            created_at=created_at,
            speakers=plan.speakers,
            dates=plan.dates,
            speaker_boost=speaker_boost,
            time_boost=time_boost,
        )
        scored.append(Scored(f, factors, f.score * math.prod(factors.values())))
    scored.sort(key=lambda s: (-s.score, min(s.fused.ranks.values()), s.fused.id))
    return scored
