"""Entity and relation extraction on write (``graph.extract``): what the graph
learns from a memory's content when the client names nothing.

An extractor turns texts into :class:`Extraction` s: the entities each text
names (people, places, organisations, products, events, dates, and the
concepts it talks about), and the relations between them that the text
states (typed, from the dependency parse) or implies (``mentioned_with``:
two entities named in one sentence). The engine merges them with what the
client sends (:meth:`indexers.engine.Engine.write_memories`); the store keeps
the relations as *derived*: each weighs as many memories as support it, and
is walked by the graph but never shown as a fact
(:mod:`indexers.postgres.derived`).

Extractors run off the event loop, on a :class:`~indexers.embedding.Lane` of
their own, and load their model once per process (on first use, or at
start-up when the config names them). :data:`EXTRACTORS` maps the
``graph.extract`` name to a factory; ``none`` extracts nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

import msgspec

__all__ = [
    "COOCCURRENCE",
    "EXTRACTORS",
    "ExtractedEntity",
    "ExtractedRelation",
    "Extraction",
    "ExtractionStats",
    "Extractor",
    "Extractors",
]

log = logging.getLogger("braid.extract")

#: The relation between two entities named in one sentence of a memory.
COOCCURRENCE = "mentioned_with"


class ExtractedEntity(msgspec.Struct, frozen=True):
    """An entity a text names, as written there (``type`` e.g. ``person``, ``concept``)."""

    name: str
    type: str


class ExtractedRelation(msgspec.Struct, frozen=True):
    """``source`` ``relation`` ``target``, both ends among the text's entities.

    :data:`COOCCURRENCE` relations are undirected: ``source`` is the end
    whose normalised name sorts first.
    """

    source: str
    relation: str
    target: str


class Extraction(msgspec.Struct, frozen=True):
    """What one text yields: its entities (most telling first) and relations."""

    entities: tuple[ExtractedEntity, ...] = ()
    relations: tuple[ExtractedRelation, ...] = ()


class ExtractionStats(msgspec.Struct):
    """This process's extraction since start (``/health``)."""

    #: ``graph.extract`` now.
    extractor: str
    #: Memories extracted from.
    memories: int = 0
    #: Memories whose extraction failed: they were stored all the same, with
    #: the client's entities only (``POST /admin/reindex {"target": "graph"}``
    #: extracts them again).
    failed: int = 0
    #: Entities and relations extracted (before merging with existing ones).
    entities: int = 0
    relations: int = 0


class Extractor(Protocol):
    """Extracts entities and relations from texts, off the event loop."""

    name: str

    async def extract(
        self, texts: Sequence[str], *, skip: frozenset[str] = frozenset(), max_entities: int = 16
    ) -> list[Extraction]:
        """One :class:`Extraction` per text, in order. Names in ``skip``
        (normalised, see :func:`indexers.postgres.normalize_name`) are not
        extracted (the tenant's speakers: who says a memory is stored as its
        ``speaker``, and a name used to address someone is not a topic).
        At most ``max_entities`` entities a text."""
        ...

    def load(self) -> None:
        """Load the model now (blocking; from a worker thread). Idempotent."""
        ...

    def close(self) -> None:
        """Stop the extractor's thread (blocking; from a worker thread)."""
        ...


def _spacy() -> Extractor:
    from .spacy_extractor import SpacyExtractor  # imports spaCy: only when named

    return SpacyExtractor()


#: ``graph.extract`` -> a factory of the extractor (``none`` has none).
EXTRACTORS: dict[str, Callable[[], Extractor]] = {"spacy": _spacy}


class Extractors:
    """The process's extractors by name, each made (and its model loaded) once,
    on first use, so a reload that turns extraction on needs no restart."""

    def __init__(self, factories: dict[str, Callable[[], Extractor]] | None = None) -> None:
        self._factories = EXTRACTORS if factories is None else factories
        self._made: dict[str, Extractor] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> Extractor | None:
        """The extractor ``name`` names; None for ``none``."""
        if name == "none":
            return None
        with self._lock:
            made = self._made.get(name)
            if made is None:
                made = self._made[name] = self._factories[name]()
            return made

    def close(self) -> None:
        """Stop every extractor made (blocking: from a worker thread)."""
        with self._lock:
            made, self._made = list(self._made.values()), {}
        for extractor in made:
            extractor.close()
