"""What the LongMemEval and BEAM suites share: the :class:`Suite` protocol the
harness drives, a recall to ask (:class:`Query`), and the turn-to-memory
helpers (neighbouring-turn context, derived entities, timestamps).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..locomo import MAX_ENTITIES, MappingOptions, turn_entities

__all__ = [
    "Column",
    "Query",
    "Suite",
    "Turn",
    "rfc3339",
    "at_position",
    "turn_memories",
]


@dataclass(frozen=True)
class Query:
    """One question, asked once per configuration in its tenant at ``at``."""

    key: str  # the question's id in the dataset
    tenant: str
    text: str
    at: datetime
    kind: str  # question type or category


@dataclass(frozen=True)
class Turn:
    """One message of a session, as the mapping needs it."""

    id: str  # memory id
    role: str  # user | assistant
    content: str
    session_id: str
    created_at: datetime
    metadata: Mapping[str, Any]


#: A report column: (question kind or "all", metric name).
Column = tuple[str, str]


class Suite(Protocol):
    """A dataset the harness loads into Braid and scores.

    ``queries`` and the rankings handed to :meth:`score` are aligned; a
    ranking is the returned memory ids, best first. ``naive`` rankings come
    from :meth:`naive_rankings` and are scored by the same :meth:`score`.
    """

    name: str
    data: Path

    def tenants(self) -> list[str]: ...

    #: Most entities named per memory unless ``--max-entities`` says otherwise.
    max_entities: int
    #: Paragraphs the report adds (what was measured to choose the mapping).
    notes: list[str]

    def memories(
        self, tenant: str, options: MappingOptions, max_chars: int, max_entities: int
    ) -> tuple[list[dict[str, Any]], int]:
        """The tenant's ``POST /v1/memories`` items, and how many were cut to ``max_chars``."""

    def queries(self) -> list[Query]: ...

    def describe(self) -> dict[str, Any]: ...

    def score(self, rankings: Sequence[Sequence[str]]) -> dict[str, Any]: ...

    def naive_rankings(
        self, vectors: Mapping[str, np.ndarray], query_vectors: Sequence[np.ndarray]
    ) -> dict[str, list[list[str]]]: ...

    #: Columns of the report's main table, and README reference figures by column.
    headline: list[Column]
    tables: dict[str, list[Column]]
    reference: dict[str, dict[Column, float]]

    def summary_line(self, report: Mapping[str, Any]) -> str: ...


def rfc3339(when: datetime) -> str:
    """``2023-05-20T15:08:01Z`` (UTC)."""
    return when.isoformat().replace("+00:00", "Z")


def turn_memories(
    turns: Sequence[Turn], options: MappingOptions, max_chars: int, max_entities: int = MAX_ENTITIES
) -> tuple[list[dict[str, Any]], int]:
    """``POST /v1/memories`` items for one session's turns, in order, and how
    many had their content or context cut to ``max_chars`` (the service's
    ``limits.maxContentChars``).

    ``context`` (left out when empty) holds up to ``options.context_before``
    preceding and ``context_after`` following turns of the session, one per
    line, as in the LoCoMo mapping; ``entities`` (when ``options.entities``)
    are the first ``max_entities`` of
    :func:`benchmarks.quality.locomo.turn_entities` of the content (proper
    names first, then content words in text order).
    """
    memories = []
    cut = 0
    for i, turn in enumerate(turns):
        if not turn.content.strip():
            raise ValueError(f"turn {turn.id} has no text: the service refuses empty content")
        content = turn.content
        around = [*turns[max(0, i - options.context_before) : i], *turns[i + 1 : i + 1 + options.context_after]]
        context = "\n".join(t.content for t in around if t.content.strip())
        if len(content) > max_chars or len(context) > max_chars:
            cut += 1
        memory: dict[str, Any] = {
            "id": turn.id,
            "content": content[:max_chars],
            "speaker": turn.role,
            "kind": "turn",
            "tier": "session",
            "session_id": turn.session_id,
            "created_at": rfc3339(turn.created_at),
            "metadata": dict(turn.metadata),
        }
        if context:
            memory["context"] = context[:max_chars]
        if options.entities:
            memory["entities"] = turn_entities({"text": content}, frozenset())[:max_entities]
        memories.append(memory)
    return memories, cut


def at_position(session_start: datetime, position: int) -> datetime:
    """The session's time plus ``position`` seconds, so turns keep their order."""
    return session_start + timedelta(seconds=position)
