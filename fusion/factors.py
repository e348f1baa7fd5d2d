"""Factors applied to a fused RRF score after fusion.

Two kinds, each a multiplier of the fused score listed by name in the
recall's ``factors`` so ``score == rrf_score * product(factors)`` can be
checked by the caller:

- **Query factors** reward a memory that matches the structure the query
  named (:mod:`fusion.query`): ``speaker`` (``1 + speakerBoost``) when its
  speaker is one the query names, ``self`` (``1 + selfBoost``) when its
  speaker is one the query's first person means (``selves``), ``time``
  (``1 + timeBoost``) when it was created on a day inside a date range the
  query names.
- **Memory factors** rank by what is known of the memory itself:
  ``recency`` (``1 + w * h / (h + age)``, age in days before the reference
  time, ``h`` the half-life: 1 + w for a memory of now, 1 + w/2 at one
  half-life), ``importance`` (``1 + w * (2 * importance - 1)``: a memory
  written without one is neutral and gets none) and ``usage``
  (``1 + w * min(1, ln(1 + n) / ln(1 + saturation))`` for a memory recalled
  ``n`` times; none for ``n == 0``).
- **The order factor** applies to a query that asks how things stand now
  (:func:`fusion.query.asks_current`), on the shortlist, the best ``window``
  candidates once the factors above are applied: ``order`` is
  ``1 + w * j / (n - 1)`` for a memory whose time is the ``j``-th oldest of
  the shortlist's ``n`` distinct times (0 for the oldest, which keeps 1). It never changes which memories make the
  shortlist, only their order: newer first among near-equals. Recency by age
  cannot do that when the two values of a fact were said minutes apart.

- **The restatement factor** (``restated``) reorders, in the best
  ``restatement_window`` candidates, each group of memories that restate one
  another (stored embeddings with cosine at least ``restatement_similarity``,
  joined transitively): the group keeps the places it holds, newest first in
  them. Nothing outside such a group moves, and the shortlist is unchanged.
  It is for a fact that changed: "I use Flask 2.0" then "I upgraded to
  Flask 2.3" minutes later. Its value is the score of the place taken over
  the memory's own, so it is below 1 for the older ones.

A weight (or boost, or similarity) of 0 turns a factor off.

Recency is hyperbolic rather than exponential: an exponential with a
half-life of weeks is flat at 0 for everything older than a few months, so
two values of one fact said three and nine months ago would score alike; the
hyperbola (the power-law shape of human forgetting curves) still orders them,
and never drives an old memory's score to 0, so a strong old match still
beats a weak new one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from datetime import date, datetime

import msgspec
import numpy as np

from fusion.query import QueryPlan
from fusion.rrf import Fused

__all__ = [
    "FactorWeights",
    "Scored",
    "apply_factors",
    "importance_factor",
    "memory_factors",
    "order_by_time",
    "restate",
    "states_change",
    "restatement_candidates",
    "recency_factor",
    "score_factors",
    "usage_candidates",
    "usage_factor",
    "with_usage",
]

_DAY_S = 86_400.0


class FactorWeights(msgspec.Struct, frozen=True, kw_only=True):
    """The factors' weights and shapes; every weight 0 (off) by default."""

    speaker_boost: float = 0.0
    time_boost: float = 0.0
    self_boost: float = 0.0
    recency: float = 0.0
    recency_half_life_days: float = 30.0
    importance: float = 0.0
    usage: float = 0.0
    #: The recall count at which the usage signal reaches 1.
    usage_saturation: int = 100
    order: float = 0.0
    #: The shortlist the order factor reorders.
    order_window: int = 10
    #: Cosine at or above which two memories restate each other; 0: off.
    restatement_similarity: float = 0.0
    #: The shortlist the restatement factor reorders.
    restatement_window: int = 10
    #: Only for a query that asks how things stand now (:func:`fusion.query.asks_current`).
    restatement_current_only: bool = False
    #: Only join a newer memory to an older one it restates when it states a
    #: change (:func:`states_change`).
    restatement_needs_change: bool = False

    def __post_init__(self) -> None:
        for name in ("speaker_boost", "time_boost", "self_boost", "recency", "importance", "usage", "order"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
        if self.importance >= 1:
            raise ValueError(f"importance must be below 1 (a factor must stay positive), got {self.importance!r}")
        if not (math.isfinite(self.recency_half_life_days) and self.recency_half_life_days > 0):
            raise ValueError(f"recency_half_life_days must be > 0, got {self.recency_half_life_days!r}")
        if self.usage_saturation < 1:
            raise ValueError(f"usage_saturation must be >= 1, got {self.usage_saturation!r}")
        if self.order_window < 2:
            raise ValueError(f"order_window must be >= 2, got {self.order_window!r}")
        if not (0.0 <= self.restatement_similarity <= 1.0):
            raise ValueError(f"restatement_similarity must be in [0, 1], got {self.restatement_similarity!r}")
        if self.restatement_window < 2:
            raise ValueError(f"restatement_window must be >= 2, got {self.restatement_window!r}")


class Scored(msgspec.Struct, frozen=True):
    """A fused id with its factors: ``score == fused.score * product(factors)``."""

    fused: Fused
    factors: dict[str, float]
    score: float


def recency_factor(created_at: datetime, reference_time: datetime, weight: float, half_life_days: float) -> float:
    """``1 + weight * h / (h + age_days)``; a memory created after the
    reference time counts as new (age 0)."""
    age = max(0.0, (reference_time - created_at).total_seconds() / _DAY_S)
    return 1.0 + weight * half_life_days / (half_life_days + age)


def importance_factor(importance: float, weight: float) -> float:
    """``1 + weight * (2 * importance - 1)``: 0.5 is neutral, 1 the most."""
    return 1.0 + weight * (2.0 * importance - 1.0)


def usage_factor(count: int, weight: float, saturation: int) -> float:
    """``1 + weight * min(1, ln(1 + count) / ln(1 + saturation))``."""
    return 1.0 + weight * min(1.0, math.log1p(count) / math.log1p(saturation))


def score_factors(
    *,
    speaker: str | None,
    created_at: datetime,
    speakers: Sequence[str],
    dates: Sequence[tuple[date, date]],
    speaker_boost: float,
    time_boost: float,
    selves: Sequence[str] = (),
    self_boost: float = 0.0,
) -> dict[str, float]:
    """The query factors a memory earns; empty when none applies.

    Speakers match case-insensitively; ``created_at`` is compared by its
    calendar day (in the zone it carries; Braid stores UTC).
    """
    return _QueryFactors(speakers, dates, speaker_boost, time_boost, selves, self_boost)(speaker, created_at)


class _QueryFactors:
    """:func:`score_factors` for one query: its boosts checked and its
    speakers folded once, then asked for each memory."""

    __slots__ = ("dates", "mine", "own", "speaker", "time", "wanted")

    def __init__(
        self,
        speakers: Sequence[str],
        dates: Sequence[tuple[date, date]],
        speaker_boost: float,
        time_boost: float,
        selves: Sequence[str] = (),
        self_boost: float = 0.0,
    ) -> None:
        for name, boost in (("speaker_boost", speaker_boost), ("time_boost", time_boost), ("self_boost", self_boost)):
            if not (math.isfinite(boost) and boost >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {boost!r}")
        self.wanted = {s.casefold() for s in speakers} if speaker_boost else set()
        self.mine = {s.casefold() for s in selves} if self_boost else set()
        self.dates = dates if time_boost else ()
        self.speaker = 1.0 + speaker_boost
        self.own = 1.0 + self_boost
        self.time = 1.0 + time_boost

    def __call__(self, speaker: str | None, created_at: datetime) -> dict[str, float]:
        factors: dict[str, float] = {}
        if self.wanted and speaker is not None and speaker.casefold() in self.wanted:
            factors["speaker"] = self.speaker
        if self.mine and speaker is not None and speaker.casefold() in self.mine:
            factors["self"] = self.own
        if self.dates:
            day = created_at.date()
            if any(first <= day <= last for first, last in self.dates):
                factors["time"] = self.time
        return factors


def memory_factors(
    *, created_at: datetime, importance: float | None, reference_time: datetime, weights: FactorWeights
) -> dict[str, float]:
    """The recency and importance factors of one memory (usage comes later,
    from :func:`with_usage`)."""
    factors: dict[str, float] = {}
    if weights.recency:
        factors["recency"] = recency_factor(created_at, reference_time, weights.recency, weights.recency_half_life_days)
    if weights.importance and importance is not None:
        factors["importance"] = importance_factor(importance, weights.importance)
    return factors


def _order(s: Scored) -> tuple[float, int, str]:
    return (-s.score, min(s.fused.ranks.values()), s.fused.id)


def apply_factors(
    fused: Sequence[Fused],
    memory: Mapping[str, tuple[str | None, datetime, float | None]],
    plan: QueryPlan,
    weights: FactorWeights,
    reference_time: datetime,
) -> list[Scored]:
    """Every fused candidate with its query, recency and importance factors, best first.

    ``memory[id]`` is the memory's ``(speaker, created_at, importance)``.
    Applied to every candidate, not just the top, so a boosted memory from
    deep in a list can still reach the top. Ties go to the best single rank,
    then the id, as in :func:`fusion.rrf`.
    """
    scored = []
    query = _QueryFactors(
        plan.speakers, plan.dates, weights.speaker_boost, weights.time_boost, plan.selves, weights.self_boost
    )
    # score_factors and memory_factors inlined, term for term (the same
    # numbers): this loop runs for every candidate of every recall.
    wanted, dates, speaker_factor, time_factor = query.wanted, query.dates, query.speaker, query.time
    mine, own_factor = query.mine, query.own
    recency, half_life, importance_weight = weights.recency, weights.recency_half_life_days, weights.importance
    for f in fused:
        speaker, created_at, importance = memory[f.id]
        factors: dict[str, float] = {}
        if wanted and speaker is not None and speaker.casefold() in wanted:
            factors["speaker"] = speaker_factor
        if mine and speaker is not None and speaker.casefold() in mine:
            factors["self"] = own_factor
        if dates:
            day = created_at.date()
            if any(first <= day <= last for first, last in dates):
                factors["time"] = time_factor
        if recency:
            age = max(0.0, (reference_time - created_at).total_seconds() / _DAY_S)
            factors["recency"] = 1.0 + recency * half_life / (half_life + age)
        if importance_weight and importance is not None:
            factors["importance"] = 1.0 + importance_weight * (2.0 * importance - 1.0)
        scored.append(Scored(f, factors, f.score * math.prod(factors.values())))
    scored.sort(key=_order)
    if weights.order and plan.current:
        scored = order_by_time(scored, {id: m[1] for id, m in memory.items()}, weights)
    return scored


def order_by_time(scored: Sequence[Scored], created: Mapping[str, datetime], weights: FactorWeights) -> list[Scored]:
    """The order factor on the best ``weights.order_window`` of ``scored``
    (best first), then best first again. Equal times share their place."""
    top = list(scored[: weights.order_window])
    if len(top) < 2:
        return list(scored)
    times = sorted({created[s.fused.id] for s in top})
    if len(times) < 2:
        return list(scored)
    place = {t: i / (len(times) - 1) for i, t in enumerate(times)}
    out = []
    for s in top:
        f = 1.0 + weights.order * place[created[s.fused.id]]
        out.append(Scored(s.fused, {**s.factors, "order": f}, s.score * f) if f != 1.0 else s)
    out.sort(key=_order)
    return out + list(scored[weights.order_window :])


def usage_candidates(scored: Sequence[Scored], top_k: int, weights: FactorWeights) -> list[str]:
    """The ids whose usage could change the top ``top_k``: every usage factor
    is at least 1 and at most ``1 + weights.usage``, so a candidate below the
    ``top_k``-th score divided by that cannot reach the top. Empty when usage
    is off."""
    if not weights.usage or not scored:
        return []
    floor = scored[min(top_k, len(scored)) - 1].score / (1.0 + weights.usage)
    return [s.fused.id for s in scored if s.score >= floor]


def with_usage(scored: Sequence[Scored], counts: Mapping[str, int], weights: FactorWeights) -> list[Scored]:
    """``scored`` with the usage factor of each id ``counts`` holds (recall
    counts; a missing or zero count earns none), best first again."""
    if not weights.usage:
        return list(scored)
    out = []
    for s in scored:
        n = counts.get(s.fused.id, 0)
        if n > 0:
            f = usage_factor(n, weights.usage, weights.usage_saturation)
            s = Scored(s.fused, {**s.factors, "usage": f}, s.score * f)
        out.append(s)
    out.sort(key=_order)
    return out


_NUMBER = re.compile(r"\d+(?:[.,:]\d+)*")
_CHANGE = re.compile(
    r"\b(?:updated?|changed?|switched|moved|rescheduled|postponed|extended|shortened|increased|decreased|"
    r"reduced|raised|lowered|upgraded|downgraded|replaced|instead|anymore|no longer|revised|adjusted)\b",
    re.IGNORECASE,
)


def states_change(newer: str, older: str) -> bool:
    """Whether ``newer`` reads as a change of what ``older`` said: it names a
    number ``older`` does not while ``older`` names one too ("8 cards" then
    "10 cards"), or it uses a word of change ("rescheduled", "increased",
    "no longer", ...; not "now" or "new", which chat uses for anything).
    English only, like :func:`fusion.query.asks_current`."""
    old_numbers = set(_NUMBER.findall(older))
    if old_numbers and set(_NUMBER.findall(newer)) - old_numbers:
        return True
    return _CHANGE.search(newer) is not None


def restatement_candidates(scored: Sequence[Scored], current: bool, weights: FactorWeights) -> list[str]:
    """The ids whose embeddings :func:`restate` needs: the best
    ``restatement_window`` of ``scored`` (best first); empty when the factor is
    off, or when it is for queries that ask how things stand now and this one
    (``current``) does not."""
    if not weights.restatement_similarity or (weights.restatement_current_only and not current):
        return []
    return [s.fused.id for s in scored[: weights.restatement_window]]


def restate(
    scored: Sequence[Scored],
    created: Mapping[str, datetime],
    vectors: Mapping[str, np.ndarray],
    weights: FactorWeights,
    content: Mapping[str, str] | None = None,
    speakers: Mapping[str, str | None] | None = None,
) -> list[Scored]:
    """``scored`` (best first) with the restatement factor on its best
    ``weights.restatement_window``: each group of restatements (unit vectors
    ``vectors[id]`` with cosine >= ``weights.restatement_similarity``, joined
    transitively; an id without a vector is in no group) takes its own places
    newest first. A memory keeps its place among equal times, and the factor
    is left out where the place does not change. With
    ``weights.restatement_needs_change``, two memories are joined only when
    the newer one's ``content[id]`` :func:`states_change` of the older one's.
    Two memories of different ``speakers[id]`` never restate each other: an
    answer that repeats a number is not a change of it."""
    n = min(weights.restatement_window, len(scored))
    if not weights.restatement_similarity or n < 2:
        return list(scored)
    top = list(scored[:n])
    have = [i for i, s in enumerate(top) if s.fused.id in vectors]
    if len(have) < 2:
        return list(scored)
    matrix = np.stack([vectors[top[i].fused.id] for i in have])
    similar = matrix @ matrix.T >= weights.restatement_similarity
    parent = list(range(len(have)))

    def root(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for a, b in zip(*np.nonzero(np.triu(similar, 1)), strict=True):
        x, y = top[have[a]].fused.id, top[have[b]].fused.id
        if speakers is not None and speakers.get(x) != speakers.get(y):
            continue
        if weights.restatement_needs_change and content is not None:
            newer, older = (x, y) if created[x] > created[y] else (y, x)
            if created[x] == created[y] or not states_change(content[newer], content[older]):
                continue
        parent[root(int(a))] = root(int(b))
    groups: dict[int, list[int]] = {}
    for a, i in enumerate(have):
        groups.setdefault(root(a), []).append(i)
    out = list(top)
    for places in groups.values():
        if len(places) < 2:
            continue
        # Python's sort is stable: equal times keep their order.
        newest_first = sorted(places, key=lambda i: created[top[i].fused.id], reverse=True)
        for place, i in zip(places, newest_first, strict=True):
            if place == i:
                continue
            s = top[i]
            target = top[place].score
            out[place] = Scored(s.fused, {**s.factors, "restated": target / s.score}, target)
    return out + list(scored[n:])
