"""Request and response bodies of the HTTP API (msgspec Structs).

Static bounds live here; bounds that come from the config (top_k, budget,
batch size, tiers, embedding dimension) are checked in :mod:`service.validate`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from indexers.engine import RecallResult

__all__ = [
    "GraphEntityIn",
    "GraphIn",
    "GraphOut",
    "HealthOut",
    "IdsOut",
    "JobOut",
    "MemoriesIn",
    "MemoryIn",
    "RecallIn",
    "RecallOut",
    "ReindexIn",
    "ReloadOut",
    "RelationIn",
]

Id = Annotated[str, Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:\-]+$")]
Label = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:\-]+$")]
# Tags and session ids may be free text, but never a backtick (Typesense quoting).
FreeLabel = Annotated[str, Meta(min_length=1, max_length=128, pattern=r"^[^`]+$")]
Unit = Annotated[float, Meta(ge=0.0, le=1.0)]
Name = Annotated[str, Meta(min_length=1, max_length=200)]
Vector = list[float]
Stamp = Annotated[datetime, Meta(tz=True)]


class _In(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    pass


class MemoryIn(_In):
    content: str
    id: Id | None = None
    kind: Label = "note"
    tier: Label = "session"
    session_id: FreeLabel | None = None
    tags: Annotated[list[FreeLabel], Meta(max_length=64)] = []
    importance: Unit | None = None
    confidence: Unit = 1.0
    created_at: Stamp | None = None
    #: Who said or wrote it; a recall naming this speaker boosts the memory.
    speaker: Name | None = None
    #: Indexed-only text (e.g. neighbouring turns): keyword-searched, never shown.
    context: str | None = None
    metadata: dict[str, Any] = {}
    entities: Annotated[list[Name], Meta(max_length=64)] = []
    embedding: Vector | None = None


class MemoriesIn(_In):
    memories: Annotated[list[MemoryIn], Meta(min_length=1)]


class IdsOut(msgspec.Struct):
    ids: list[str]


class GraphEntityIn(_In):
    name: Name
    type: Label | None = None
    summary: Annotated[str, Meta(max_length=4000)] | None = None


class RelationIn(_In):
    source: Name
    relation: Annotated[str, Meta(min_length=1, max_length=100)]
    target: Name
    weight: Annotated[float, Meta(gt=0.0, le=1000.0)] = 1.0
    valid_from: Stamp | None = None
    valid_to: Stamp | None = None


class GraphIn(_In):
    entities: list[GraphEntityIn] = []
    relations: list[RelationIn] = []


class GraphOut(msgspec.Struct):
    entities: int
    relations: int


class RecallIn(_In):
    query: str
    top_k: int | None = None
    budget_tokens: int | None = None
    min_confidence: Unit | None = None
    session_id: FreeLabel | None = None
    tags: Annotated[list[FreeLabel], Meta(max_length=64)] | None = None
    kinds: Annotated[list[Label], Meta(max_length=64)] | None = None
    tiers: Annotated[list[Label], Meta(max_length=16)] | None = None
    created_after: Stamp | None = None
    created_before: Stamp | None = None
    sources: Annotated[list[Literal["typesense", "pgvector", "graph"]], Meta(min_length=1)] | None = None
    embedding: Vector | None = None


#: The recall answer is the engine's result, as is.
RecallOut = RecallResult


class ReindexIn(_In):
    target: Literal["typesense", "pgvector", "all"]
    tier: Label | None = None


class JobOut(msgspec.Struct):
    job_id: str
    target: str
    tier: str | None
    status: str
    progress: dict[str, Any]
    error: str | None
    created_at: datetime
    finished_at: datetime | None


class ReloadOut(msgspec.Struct):
    reloaded: bool
    path: str


class HealthOut(msgspec.Struct):
    status: Literal["ok", "degraded"]
    backends: dict[str, dict[str, Any]]
