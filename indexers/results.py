"""What a recall takes and gives back, and what a reload reports (the engine's
side of the API; ``service.schemas`` is the HTTP side)."""

from __future__ import annotations

from datetime import date, datetime
from typing import Annotated, Literal

import msgspec

from .base import Filters, Shown
from .registry import BOTH, Match, SourceStatus

__all__ = [
    "STRATEGY_MATCHES",
    "EmbeddingStatus",
    "QueryInfo",
    "RecallItem",
    "RecallOptions",
    "RecallResult",
    "ReloadReport",
    "SourceReport",
    "Strategy",
    "changed_keys",
]

#: How a recall finds memories. ``auto``: every source, fused; ``semantic``:
#: the sources that match by the query vector; ``keyword``: those that match
#: by its words (no query embedding made); ``recent``: no search, the newest
#: memories that pass the filters, from Postgres.
Strategy = Literal["auto", "semantic", "keyword", "recent"]

#: What a searching strategy lets the sources match by (``recent`` searches none).
STRATEGY_MATCHES: dict[Strategy, frozenset[Match]] = {
    "auto": BOTH,
    "semantic": frozenset({"vector"}),
    "keyword": frozenset({"keyword"}),
}


class RecallOptions(msgspec.Struct, frozen=True):
    #: The query text; empty only for ``auto`` (then ``recent``) and ``recent``.
    query: str
    top_k: int | None = None
    budget_tokens: int | None = None
    min_confidence: float | None = None
    filters: Filters = Filters()
    sources: tuple[str, ...] | None = None
    embedding: tuple[float, ...] | None = None
    #: The model that made ``embedding``; None = the service's.
    embedding_model: str | None = None
    #: Relation hops of the graph walk; None = graph.maxHops.
    hops: int | None = None
    #: "Now" for the time-based factors (UTC); None = the server's clock.
    reference_time: datetime | None = None
    #: Record the returned memories' use (the bookkeeping queue).
    track: bool = True
    strategy: Strategy = "auto"


class RecallItem(Shown, frozen=True, kw_only=True):
    """One recalled memory (its shown fields) and how its score came about:
    ``score == rrf_score * product(factors.values())`` and
    ``rrf_score == sum(contributions.values())``."""

    score: float
    rrf_score: float
    ranks: dict[str, int | None]
    contributions: dict[str, float]
    factors: dict[str, float]
    in_block: bool
    truncated: bool


class QueryInfo(msgspec.Struct):
    """What the query analysis made of the query (:mod:`fusion.query`)."""

    #: The text the sources searched (and the query embedding was made of).
    text: str
    #: Known speakers the query is about: their memories are boosted.
    speakers: list[str]
    #: Inclusive ``[first, last]`` day ranges the query names.
    dates: list[tuple[date, date]]
    #: The query asks how things stand now (the order factor applies).
    current: bool = False
    #: Known speakers the query only addresses ("Thanks, Melanie!") or names
    #: as who says it ("Melanie: ..."): taken out of the searched text, not boosted.
    addressed: list[str] = msgspec.field(default_factory=list)
    #: Known speakers named only as the other party of another named speaker
    #: ("What did Caroline recommend to Melanie?"): taken out of the searched
    #: text, not boosted.
    others: list[str] = msgspec.field(default_factory=list)
    #: Known speakers the query's first person means (``query.selfSpeakers``):
    #: boosted by ``query.selfBoost``.
    selves: list[str] = msgspec.field(default_factory=list)


EmbeddingStatus = Literal["ok", "client", "timeout", "error", "none"]

_EMBEDDING_STATUS = (
    "`ok`: made by the model (or found in its cache) within embedding.queryDeadlineMs; "
    "`client`: the request gave it; `timeout`: not made in time, so the recall searched "
    "without a vector (pgvector skipped as `no_vector`, Typesense by keyword only, the "
    "graph seeded by the names in the query) and `degraded` starts with `embedding`; "
    "`error`: the hosted embedding server failed (embedding.provider `openai`), handled "
    "like `timeout`; `none`: the strategy needs none (`keyword`, `recent`), none was made."
)
_STRATEGY = (
    "The strategy that ran: the one asked for, except that `auto` runs as `recent` for an "
    "empty or missing query and as `keyword` when the query embedding missed "
    "embedding.queryDeadlineMs or failed."
)
_SOURCE_STATUS = (
    "`ok`; `timeout`: no answer within its deadlineMs; `error`: it failed; `no_vector`: it "
    "searches by vector only and the query embedding missed embedding.queryDeadlineMs; "
    "`skipped`: not asked for. `timeout`, `error` and `no_vector` name it in `degraded`."
)


class SourceReport(msgspec.Struct):
    """How one source fared in a recall."""

    status: Annotated[SourceStatus, msgspec.Meta(description=_SOURCE_STATUS)]
    ms: float
    hits: int
    error: str | None = None


class RecallResult(msgspec.Struct):
    block: str
    tokens: int
    items: list[RecallItem]
    sources: dict[str, SourceReport]
    #: Sources that timed out, failed or could not search without a vector, after
    #: ``"embedding"`` when the query embedding missed its deadline or failed.
    degraded: list[str]
    #: Time spent getting the query embedding (0 when the request gave it).
    embedding_ms: float
    embedding_status: Annotated[EmbeddingStatus, msgspec.Meta(description=_EMBEDDING_STATUS)]
    query: QueryInfo
    strategy: Annotated[Strategy, msgspec.Meta(description=_STRATEGY)]
    #: Served from the result cache (``cache.ttlMs``): an identical earlier
    #: recall's answer, computed after the tenant's last write.
    cached: bool = False
    #: The Postgres the recall read: ``replica`` (``postgres.replicaDsn``) once
    #: it has replayed the tenant's writes, else ``primary``.
    served_by: Literal["primary", "replica"] = "primary"


class ReloadReport(msgspec.Struct):
    #: Changed keys that take effect at the next start (until then the old values hold).
    restart_required: list[str]
    #: Changed tier index settings that take effect through ``POST /admin/reindex``.
    reindex_required: list[str]


def changed_keys(old: msgspec.Struct, new: msgspec.Struct) -> list[str]:
    """The (camelCase) keys whose values differ between two config sections."""
    a, b = msgspec.to_builtins(old), msgspec.to_builtins(new)
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
