"""What the store writes: a memory, an entity and a relation, validated by the caller."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

__all__ = ["EntityInput", "MemoryInput", "RelationInput"]


class MemoryInput(msgspec.Struct, frozen=True):
    """A validated memory to write.

    ``embedding`` is ``None`` until the engine embeds the content; the store
    only accepts inputs whose embedding and ``model`` are filled in.
    """

    content: str
    kind: str
    tier: str
    created_at: datetime
    id: str | None = None
    session_id: str | None = None
    tags: tuple[str, ...] = ()
    importance: float | None = None
    confidence: float = 1.0
    speaker: str | None = None
    context: str | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    entities: tuple[str, ...] = ()
    embedding: tuple[float, ...] | None = None
    #: The model that made ``embedding``; a given embedding without one is
    #: taken to be the service's model's.
    model: str | None = None
    #: The fact it states; writing it retires the key's current memory.
    mem_key: str | None = None
    #: When the memory expires (UTC); ``None``: never by itself.
    expires_at: datetime | None = None
    #: ``created_at`` is the service's "now", not the writer's: a keyed memory
    #: is then stamped again once its key's lock is held, so writers of a key
    #: are dated in the order they commit (an earlier stamp would retire a
    #: memory on arrival behind a writer that took the lock first).
    stamped: bool = False


class EntityInput(msgspec.Struct, frozen=True):
    """An entity to create or update, found by its name (see :func:`.names.normalize_name`)."""

    name: str
    embedding: tuple[float, ...]
    model: str
    type: str | None = None
    summary: str | None = None


class RelationInput(msgspec.Struct, frozen=True):
    """A relation between two entities named by ``source`` and ``target``."""

    source: str
    relation: str
    target: str
    weight: float = 1.0
    valid_from: datetime | None = None
    valid_to: datetime | None = None
