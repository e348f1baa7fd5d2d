"""The shared search interface every backend implements, and the error tree.

A source takes a :class:`SearchQuery` (always tenant-scoped) and returns a
ranked list of :class:`Hit`, best first. Fusion works on the hits' ids; the
hits carry what the memory block needs so nothing is fetched twice.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Literal, Protocol, runtime_checkable

import msgspec
import psycopg
from psycopg_pool import PoolTimeout

from config import BraidError

__all__ = [
    "RECORD_FIELDS",
    "SHOWN_FIELDS",
    "BackendError",
    "EmbeddingRefused",
    "EmbeddingUnavailable",
    "Shown",
    "StoreUnavailable",
    "UnstorableValue",
    "WriteTimeout",
    "failure_reason",
    "postgres_errors",
    "Filters",
    "Hit",
    "MemoryRecord",
    "SearchQuery",
    "SearchesFirst",
    "Source",
    "SourceUnavailable",
]


class Filters(msgspec.Struct, frozen=True):
    """Restrictions a recall puts on the memories it may return.

    Every field is optional; ``None`` means no restriction. ``tags`` matches a
    memory that has any of the given tags. ``tiers`` holds memory tier names.
    Every source applies every field in its own search (never by cutting the
    fused list), so a selective filter still fills ``top_k``.
    """

    session_id: str | None = None
    tags: tuple[str, ...] | None = None
    kinds: tuple[str, ...] | None = None
    tiers: tuple[str, ...] | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    #: A JSON object the memory's metadata must contain (Postgres ``@>``
    #: containment); ``None`` or ``{}`` restricts nothing.
    metadata: dict[str, Any] | None = None
    #: The memory's importance must be at least this (compared as stored, a
    #: float32); a memory written without importance does not match.
    min_importance: float | None = None
    #: Time travel: only memories created at or before this instant (UTC) and
    #: not superseded then, and relations valid then. ``None``: now, and
    #: only current memories (never a superseded one, whatever its time).
    as_of: datetime | None = None


class SearchQuery(msgspec.Struct, frozen=True):
    """One search, as every source receives it."""

    tenant: str
    text: str
    #: The query embedding (L2-normalised), or ``None`` if no vector is known.
    vector: tuple[float, ...] | None
    #: How many hits the source should return at most.
    limit: int
    filters: Filters = Filters()
    #: Memories below this stored confidence are not returned.
    min_confidence: float = 0.0
    #: Relation hops of a graph walk; None = the config's graph.maxHops.
    hops: int | None = None
    #: Another source of this recall covers the vector's nearest memories
    #: (``SourceSpec.covers_vectors``): this one may leave vector search to it.
    vectors_covered: bool = False
    #: "Now" for time-based scoring (UTC): the recall's ``reference_time`` or
    #: the server's clock when the recall began.
    reference_time: datetime | None = None
    #: What the source may match by in this recall (its strategy): the
    #: query's words (``keyword``), its vector (``vector``), or both.
    matches: frozenset[Literal["keyword", "vector"]] = frozenset(("keyword", "vector"))
    #: The model ``vector`` was made by: a vector search compares it only with
    #: memories (and entities) whose stored embedding that model made.
    model: str = ""
    #: For a source that searches a copy of Postgres (``SourceSpec.derived``):
    #: the memories matching the recall's filters that were written but are
    #: not in its copy yet (their outbox rows pending), as stored now. The
    #: source ranks them as it would once they arrive, so a memory written a
    #: moment ago is not pushed down by an index that has not caught up.
    unindexed: tuple[MemoryRecord, ...] = ()
    #: ``False``: return the nearest without the source's relevance floors
    #: (the recall's search within the dates its query names, where every
    #: memory is a candidate). A source without floors ignores it.
    floors: bool = True


class Shown(msgspec.Struct, frozen=True, kw_only=True):
    """The memory model's shown part: what every search hit carries and every
    recalled item shows. :class:`Hit`, :class:`MemoryRecord` and the recall's
    items extend it, and the SQL columns and Typesense fields a hit is read
    from are derived from it (:data:`SHOWN_FIELDS`), so a field added here
    needs a column (a migration) and whatever gives it meaning, nothing else."""

    id: str
    content: str
    kind: str
    tier: str
    created_at: datetime
    confidence: float
    #: Who said or wrote it (a person's name, ``user``, ``assistant``).
    speaker: str | None = None
    #: How much it matters, 0-1, as written; ``None`` (not given) is neutral.
    importance: float | None = None
    #: The fact it states (e.g. ``user.home_city``): a newer memory with the
    #: same key supersedes it. ``None`` for a memory without one.
    mem_key: str | None = None
    #: When it expires (UTC; the write's ``expires_at`` or ``ttl_seconds``);
    #: ``None``: only a tier's retention or the activation floor can end it.
    expires_at: datetime | None = None


class Hit(Shown, frozen=True, kw_only=True):
    """One ranked result. ``score`` is the source's own, higher is better."""

    score: float


@runtime_checkable
class Source(Protocol):
    """A search backend. Nothing outside the registry branches on its name."""

    name: str
    #: True for a source that cannot search without the query vector: a recall
    #: whose query embedding missed ``embedding.queryDeadlineMs`` skips it and
    #: names it degraded (status ``no_vector``). A source that also searches
    #: by text says False and searches by text alone then.
    needs_vector: bool

    async def search(self, query: SearchQuery) -> list[Hit]: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class SearchesFirst(Protocol):
    """A derived source that sends its searches before it needs the recall's
    unindexed memories (:attr:`SearchQuery.unindexed`), so the read of them
    and its searches overlap: :meth:`search_first` awaits ``unindexed()``
    only to rank what came back (``query.unindexed`` is not read)."""

    async def search_first(
        self, query: SearchQuery, unindexed: Callable[[], Awaitable[tuple[MemoryRecord, ...]]]
    ) -> list[Hit]: ...


class BackendError(BraidError):
    """Base of every error raised by a backend adapter."""


class SourceUnavailable(BackendError):
    """A backend could not be reached or answered with an error."""

    def __init__(self, source: str, reason: str) -> None:
        super().__init__(f"{source} unavailable: {reason}")
        self.source = source
        self.reason = reason


class StoreUnavailable(BackendError):
    """Postgres could not be reached or gave no connection in time.
    ``during`` says whether a read or a write was refused (a refused write
    stored nothing)."""

    def __init__(self, during: Literal["read", "write"], reason: str) -> None:
        # The reason (socket paths, server messages) is for the log, not the client.
        super().__init__("postgres unavailable")
        self.during = during
        self.reason = reason


class WriteTimeout(BackendError):
    """Postgres did not finish a write step in time. Unlike a refused
    connection, the outcome is unknown: a COMMIT held by a stalled server may
    still land. A retry with the same ids is safe (a write replaces)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(
            f"postgres did not answer within {seconds:g} s; the write may or may not "
            "have been stored: retry it with the same ids (a write with ids replaces, "
            "never duplicates)"
        )


class EmbeddingUnavailable(BackendError):
    """The embedding server could not be reached, did not answer in time
    (retries included), or answered with an error or something that is not
    the embeddings asked for. A write that needed it stored nothing."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"embedding server unavailable: {reason}")
        self.reason = reason


class EmbeddingRefused(BraidError):
    """The embedding server refused the texts themselves (its 400, 413 or
    422, e.g. a text longer than the model takes): sending them again would
    not help. A write that needed it stored nothing."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"the embedding server refused the text: {reason}")
        self.reason = reason


class UnstorableValue(BraidError):
    """Postgres refused a value the request carries (a NUL in text or JSON, a
    number a ``real`` column cannot hold); its transaction was rolled back."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"a value in the request cannot be stored: {reason}")


def failure_reason(exc: BaseException, seconds: float | None = None) -> str:
    """Why a backend step failed, for a log line or a status. A deadline's
    ``TimeoutError`` says nothing itself: it reads ``no answer within <ms> ms``
    (``seconds``: the deadline), or ``timed out`` without one. Any other
    error reads as its message, or its class name when it has none."""
    text = str(exc).strip()
    if isinstance(exc, TimeoutError) and not text:
        return "timed out" if seconds is None else f"no answer within {seconds * 1000:g} ms"
    return text or type(exc).__name__


@contextmanager
def postgres_errors(during: Literal["read", "write"]) -> Iterator[None]:
    """Translate the Postgres errors a request can cause into the error tree."""
    try:
        yield
    except psycopg.DataError as exc:
        raise UnstorableValue(exc.diag.message_primary or str(exc).splitlines()[0]) from exc
    except (psycopg.OperationalError, PoolTimeout) as exc:
        raise StoreUnavailable(
            during, str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        ) from exc


class MemoryRecord(Shown, frozen=True, kw_only=True):
    """A memory as stored in Postgres, the shape derived indexes are fed: the
    shown fields and the rest of the row (:data:`RECORD_FIELDS`)."""

    tenant: str
    session_id: str | None = None
    tags: tuple[str, ...] = ()
    #: Indexed-only text (e.g. the neighbouring turns): searched by keyword,
    #: never shown in the memory block.
    context: str | None = None
    #: L2-normalised embedding; ``None`` only for a record that has none yet.
    embedding: tuple[float, ...] | None = None
    #: The model that produced ``embedding`` (e.g. ``all-MiniLM-L6-v2``).
    model: str | None = None
    #: The memory's metadata (a JSON object), as written.
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    #: When a newer memory of its ``mem_key`` retired it (that memory's
    #: ``created_at``); ``None`` while it is current.
    superseded_at: datetime | None = None
    #: The id of the memory that retired it.
    superseded_by: str | None = None


#: The shown fields, in order: the columns and document fields a hit is read from.
SHOWN_FIELDS: tuple[str, ...] = tuple(f.name for f in msgspec.structs.fields(Shown))
#: Every stored field of a memory: the columns a record is read from.
RECORD_FIELDS: tuple[str, ...] = tuple(f.name for f in msgspec.structs.fields(MemoryRecord))
