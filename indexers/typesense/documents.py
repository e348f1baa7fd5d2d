"""Memories as Typesense documents, and the ``filter_by`` expressions over them.

A memory has two documents, one in each of two collections: its keyword
document (:func:`record_document`: the fields, the text and its terms, no
embedding) and its vector document (:func:`vector_document`: the fields
filters and hits need, and the embedding). Typesense 0.24.1 reads a hit's
stored document whole, so keyword searches that never read a vector are
not slowed by 384 stored floats a hit (``docs/design.md``, Typesense). A
collection made by an older Braid holds both in one document
(:func:`combined_document`) until a reindex splits it.

Memory ids are unique per tenant only (Postgres' key is ``(tenant, id)``),
while a Typesense document id is unique per collection, so a document's id
is ``<tenant>:<memory id>`` (:func:`document_id`; a tenant name has no colon)
and the memory id is stored beside it in ``memory_id``.

In Typesense 0.24.1 ``field:[a]`` on a string matches any value *containing
the token* ``a``; only ``field:=[a]`` is exact, so every string filter here
uses ``:=``. Values are wrapped in backticks (which may hold commas, not
backticks).

Exact is not exact enough for a tenant: a filter folds case and drops ``-``
and ``_`` from the value and the stored string alike, so ``tenant:=`acme-corp```
also matches ``acmecorp``'s documents. Every filter therefore names a tenant
by its key (:func:`tenant_key`, lowercase hex that Typesense keeps whole),
and the source checks each hit's ``tenant`` as well. The key also keeps a
filter's cost with the tenant's own documents rather than the collection's:
``current_key`` (the key, on a current memory's documents only) stands for
"this tenant, not superseded" (in a pair of the tenant's own, where it would
match nearly every document, it is checked on the hits instead), and ``tenant_terms`` holds the keyword
document's terms behind a prefix of the key (:func:`term_key`), so that
``bm25``'s term filters read the tenant's posting lists, not every tenant's.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec
import numpy as np

from config import is_safe_name

from ..base import SHOWN_FIELDS, Filters, Hit, MemoryRecord
from . import metadata
from .keywords import STEM, STOPWORDS, is_own_stem, text_terms
from .keywords import stems as stem_words

__all__ = [
    "NO_EXPIRY",
    "TERM_FIELDS",
    "KEY_FIELDS",
    "document_field",
    "document_terms",
    "counts_findall",
    "counts_reader",
    "hit_from_document",
    "build_filter",
    "collection_schema",
    "combined_document",
    "document_id",
    "keyed_terms",
    "stem_key",
    "tenant_key",
    "tenant_terms",
    "term_entries",
    "term_key",
    "TERM_KEY_DIGITS",
    "group_alias",
    "lifecycle_filter",
    "NEVER",
    "narrow_filter",
    "quoted",
    "quoted_list",
    "record_document",
    "vector_document",
    "vector_literal",
    "vectors_alias",
    "vectors_collection",
    "vectors_schema",
]

#: The ``expires_at`` of a document whose memory has no expiry (9999-12-31T23:59:59Z),
#: so that the field is always there and a numeric filter on it is possible.
NO_EXPIRY = 253402300799

_encode_json = msgspec.json.Encoder().encode

#: Below the smallest normal float32 Typesense cannot parse a vector component
#: ("one of the vector values is not a float"); it stores float32 anyway.
_FLOAT32_TINY = 1.1754944e-38


def quoted(value: str) -> str:
    """A filter value in backticks. Defence in depth: the HTTP layer already
    refuses such values, and a backtick cannot be escaped in Typesense."""
    if "`" in value:
        raise ValueError(f"filter value {value!r} contains a backtick")
    return f"`{value}`"


def quoted_list(values: Iterable[str]) -> str:
    """Filter values as a bracketed list, each in backticks (:func:`quoted`)."""
    return "[" + ",".join(quoted(v) for v in values) + "]"


def _epoch(dt: datetime) -> int:
    """Whole epoch seconds; a naive datetime is taken to be UTC."""
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return math.floor(dt.timestamp())


#: ``superseded_at`` of a current memory's document: after every instant a
#: memory can hold (years 1-9999), so "current at t" is ``superseded_at:>t``
#: for every t, and "current" is ``superseded_at:=NEVER``.
NEVER = 253_402_300_800_000_000


def _micros(dt: datetime) -> int:
    """Epoch microseconds, exact (Postgres keeps microseconds): ``superseded_at``
    compares with ``as_of`` to the microsecond."""
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    delta = dt - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def lifecycle_filter(as_of: datetime | None) -> str:
    """The ``filter_by`` clauses of a memory's lifecycle: current (never
    superseded), or with ``as_of`` created by then and not superseded then
    (``created_at`` holds whole seconds: a memory of ``as_of``'s own second
    but later passes, and the engine's check against Postgres drops it)."""
    if as_of is None:
        return f"superseded_at:={NEVER}"
    return f"created_at:<={_epoch(as_of)} && superseded_at:>{_micros(as_of)}"


def vector_literal(values: Iterable[float] | np.ndarray) -> str:
    """A query vector as ``vector_query`` takes it: each component as the
    shortest decimal that reads back as the same float, in JSON's forms
    (``0.00001``, ``1.5e-7``), those too small for a normal float32 written
    as 0. A NaN or infinite component is a :class:`ValueError` (the API
    refuses such vectors before they get here)."""
    array = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=np.float64)
    if not np.isfinite(array).all():
        raise ValueError("a query vector component is NaN or infinite")
    array = np.where(np.abs(array) < _FLOAT32_TINY, 0.0, array)
    # msgspec writes the whole list in C.
    return _encode_json(array.tolist())[1:-1].decode()


def document_id(tenant: str, memory_id: str) -> str:
    """The Typesense id of a tenant's memory: ``<tenant>:<memory id>``."""
    if not is_safe_name(tenant):
        raise ValueError(f"invalid tenant name {tenant!r}")
    return f"{tenant}:{memory_id}"


#: Fields derived from the content and context for the ``bm25`` keyword mode
#: (:func:`document_terms`, :func:`tenant_terms`), not memory fields.
TERM_FIELDS = ("term_counts", "length", "context_length", "tenant_terms")

#: Fields derived from the tenant and the lifecycle that filters read
#: (:func:`tenant_key`), on both documents of a memory.
KEY_FIELDS = ("tenant_key", "current_key")


def document_terms(content: str, context: str | None, stems: bool = False) -> tuple[list[str], str, int, int]:
    """The ``terms``, ``term_counts``, ``length`` and ``context_length`` of a
    document, with ``stems`` in two fields of one BM25 (:func:`~.keywords.bm25_terms`):

    - words: the distinct words of the content and context that are not
      stopwords (:func:`~.keywords.text_terms`, the normalisation of query
      terms), in order of first appearance;
    - with ``stems``, then, behind :data:`~.keywords.STEM`, the distinct
      stems (:func:`~.keywords.stems`) of those of the words that are not
      their own stem (``~paint`` for ``paints`` or ``painted``; ``paint``
      itself is a stem's only as the word ``paint``: :func:`term_entries`).

    ``term_counts``: how often each term occurs in the content and in the
    context (``;<term>:<content>:<context>`` for each, then ``;``; read by
    :func:`counts_reader`; a stem's, how often words of that stem other than
    itself do). ``length`` and ``context_length``: how many words the content
    and the context have, stopwords and repeats included (BM25's document
    length)."""
    own = text_terms(content)
    around = text_terms(context) if context else []
    words = [t for t in dict.fromkeys(own + around) if t not in STOPWORDS]
    in_own, in_around = Counter(own), Counter(around)
    counts = "".join(f";{t}:{in_own[t]}:{in_around[t]}" for t in words)
    if stems:
        stem_own: Counter[str] = Counter()
        stem_around: Counter[str] = Counter()
        for word, stem in zip(words, stem_words(words), strict=True):
            if stem != word:
                stem_own[stem] += in_own[word]
                stem_around[stem] += in_around[word]
        words += [STEM + s for s in stem_own]
        counts += "".join(f";{STEM}{s}:{stem_own[s]}:{stem_around[s]}" for s in stem_own)
    return words, f"{counts};" if counts else "", len(own), len(around)


@functools.lru_cache(maxsize=65_536)
def term_entries(term: str) -> tuple[str, ...]:
    """The ``term_counts`` entries (and ``tenant_terms`` values, through
    :func:`keyed_terms`) that make up a query term's count in a document: a
    word's own entry; for a stem's term (``~paint``), its own entry and, when
    the stem is a word that is its own stem, that word's."""
    if term.startswith(STEM) and is_own_stem(stem := term[len(STEM) :]):
        return (term, stem)
    return (term,)


def counts_reader(terms: Sequence[str]) -> Callable[[str], dict[str, tuple[int, int]]]:
    """A reader of ``term_counts``: given a document's, the content and
    context counts of those of ``terms`` it has (one pass over it; a term
    it lacks is not in the answer). Terms are alphanumerics only (a stem's
    behind ``~``), so ``;`` and ``:`` never occur in one."""
    findall = counts_findall(terms)
    if findall is None:
        return lambda counts: {}
    return lambda counts: {term: (int(own), int(around)) for term, own, around in findall(counts)}


def counts_findall(terms: Sequence[str]) -> Callable[[str], list[tuple[str, str, str]]] | None:
    """What :func:`counts_reader` reads, as ``re.findall`` gives it: given a
    document's ``term_counts``, each of ``terms`` it has as ``(term,
    content count, context count)``, the counts as digits, in the order
    stored (``None`` for no terms: nothing to find)."""
    return _counts_pattern(tuple(terms)).findall if terms else None


@functools.lru_cache(maxsize=1024)
def _counts_pattern(terms: tuple[str, ...]) -> re.Pattern[str]:
    """The pattern of :func:`counts_reader`, compiled once per term list."""
    return re.compile(";(" + "|".join(map(re.escape, terms)) + r"):(\d+):(\d+)(?=;)")


@functools.lru_cache(maxsize=65_536)
def tenant_key(tenant: str) -> str:
    """The tenant's key in Typesense filters: 32 lowercase hex digits of a
    BLAKE2b hash of its name, the same in every process and release. Tenants
    differing only in case, ``-`` or ``_`` (which a filter ignores) get
    different keys. A name Braid would refuse is a :class:`ValueError`."""
    if not is_safe_name(tenant):
        raise ValueError(f"invalid tenant name {tenant!r}")
    return hashlib.blake2b(tenant.encode(), digest_size=16).hexdigest()


#: Hex digits of the tenant's key before each of its terms in ``tenant_terms``
#: (:func:`term_key`). The prefix only keeps a term's posting list to about
#: the tenant's own documents: every filter on the terms in a shared
#: collection also names the tenant by its whole key (``current_key`` or
#: ``tenant_key``; a pair of the tenant's own holds no other tenant), so two
#: tenants of one collection whose prefixes agree (odds about n^2 / 2^33 for
#: n tenants) share longer posting lists, never a hit. Each digit is stored in
#: every term of every keyword document, and Typesense reads a hit's stored
#: document whole: the whole 32-digit key before each term made a keyword
#: document of the load corpus a third larger
#: (``benchmarks/results/typesense-term-key.md``).
TERM_KEY_DIGITS = 8


def term_key(tenant: str) -> str:
    """The prefix of the tenant's terms in ``tenant_terms``: the first
    :data:`TERM_KEY_DIGITS` digits of its :func:`tenant_key`."""
    return tenant_key(tenant)[:TERM_KEY_DIGITS]


def keyed_terms(key: str, terms: Iterable[str]) -> list[str]:
    """``terms`` each behind ``key`` (a :func:`term_key`: fixed width, so no
    two key and term pairs give one token), a stem's (``~paint``) behind
    :func:`stem_key` instead, as ``tenant_terms`` holds them and its filters
    name them (Typesense's ``:=`` would ignore the ``~``)."""
    return [stem_key(key) + term[len(STEM) :] if term.startswith(STEM) else key + term for term in terms]


def stem_key(key: str) -> str:
    """The key a tenant's stems are behind in ``tenant_terms``: its term key
    with the top bit of the first digit flipped (never the key itself)."""
    return f"{int(key[0], 16) ^ 8:x}{key[1:]}"


def tenant_terms(tenant: str, terms: Iterable[str]) -> list[str]:
    """``terms`` as the tenant's documents hold them in ``tenant_terms``."""
    return keyed_terms(term_key(tenant), terms)


def group_alias(alias: str, tenant: str, groups: int) -> str:
    """The alias of the collection pair that holds ``tenant``'s memories when
    tenants are spread over ``groups`` pairs: ``alias`` itself for one group,
    else ``<alias>_g<n>`` with ``n`` the tenant's group, from a hash of its
    name that is the same in every process and release (BLAKE2b; Python's
    own ``hash`` of a string changes with each process)."""
    if groups < 1:
        raise ValueError(f"groups must be >= 1, got {groups!r}")
    if groups == 1:
        return alias
    digest = hashlib.blake2b(tenant.encode(), digest_size=8).digest()
    return f"{alias}_g{int.from_bytes(digest, 'big') % groups}"


def vectors_alias(alias: str) -> str:
    """The alias of the vectors collection beside the keyword alias ``alias``."""
    return f"{alias}_vectors"


def vectors_collection(name: str) -> str:
    """The vectors collection made with the keyword collection ``name``."""
    return f"{name}_vectors"


def _shared_fields(record: MemoryRecord) -> dict[str, Any]:
    """What both documents of a memory hold: its id, the fields filters and
    hits read, its lifecycle; epoch seconds, no ``None`` fields."""
    doc: dict[str, Any] = {
        "id": document_id(record.tenant, record.id),
        "memory_id": record.id,
        "tenant": record.tenant,
        "tenant_key": tenant_key(record.tenant),
        "content": record.content,
        "kind": record.kind,
        "tier": record.tier,
        "created_at": _epoch(record.created_at),
        "confidence": float(record.confidence),
        "tags": list(record.tags),
        "superseded_at": NEVER if record.superseded_at is None else _micros(record.superseded_at),
        "expires_at": NO_EXPIRY if record.expires_at is None else _epoch(record.expires_at),
    }
    if record.superseded_at is None:
        doc["current_key"] = doc["tenant_key"]
    if record.mem_key is not None:
        doc["mem_key"] = record.mem_key
    if record.session_id is not None:
        doc["session_id"] = record.session_id
    if record.speaker is not None:
        doc["speaker"] = record.speaker
    if record.importance is not None:
        doc["importance"] = float(record.importance)
    if record.model is not None:
        doc["model"] = record.model
    if record.metadata:
        doc[metadata.FIELD] = metadata.document_tokens(record.metadata)
    return doc


def record_document(record: MemoryRecord, *, stems: bool = False) -> dict[str, Any]:
    """The keyword document of a memory: the shared fields, its context, its
    terms behind the tenant's key with their counts and lengths
    (:func:`document_terms`, :func:`tenant_terms`) and ``superseded_by``;
    never its embedding. The bare terms are not sent: no filter reads them
    since filters name the tenant by its key (an older document may still
    hold them, in an older schema's ``terms``), and indexing them cost
    Typesense CPU on every import (``benchmarks/results/typesense-import-cost.md``)."""
    doc = _shared_fields(record)
    terms, doc["term_counts"], doc["length"], doc["context_length"] = document_terms(
        record.content, record.context, stems
    )
    doc["tenant_terms"] = tenant_terms(record.tenant, terms)
    if record.superseded_by is not None:
        doc["superseded_by"] = record.superseded_by
    if record.context:
        doc["context"] = record.context
    return doc


def vector_document(record: MemoryRecord) -> dict[str, Any]:
    """The vector document of a memory: the shared fields and its embedding
    (none for a memory without one: the document still replaces an older
    one that had a vector)."""
    doc = _shared_fields(record)
    if record.embedding is not None:
        doc["embedding"] = [float(x) for x in record.embedding]
    return doc


def combined_document(record: MemoryRecord, *, stems: bool = False) -> dict[str, Any]:
    """Both documents in one, for a collection made by an older Braid that
    serves keyword and vector searches alike."""
    doc = record_document(record, stems=stems)
    if record.embedding is not None:
        doc["embedding"] = [float(x) for x in record.embedding]
    return doc


def document_field(name: str) -> str:
    """The document field holding a memory's field ``name`` (``id`` is the
    document's own id, tenant-qualified; the memory's is ``memory_id``;
    ``metadata`` is held as its containment tokens, :data:`metadata.FIELD`)."""
    return {"id": "memory_id", "metadata": metadata.FIELD}.get(name, name)


#: Each shown field and the document field holding it.
_SHOWN_FROM = tuple((name, document_field(name)) for name in SHOWN_FIELDS)


def hit_from_document(doc: Mapping[str, Any], score: float) -> Hit:
    """A document (with at least the shown fields) as a search hit."""
    values: dict[str, Any] = {name: doc.get(field) for name, field in _SHOWN_FROM}
    values["created_at"] = datetime.fromtimestamp(values["created_at"], tz=UTC)
    # Missing in a document written by an older Braid: no expiry.
    expires = values["expires_at"]
    values["expires_at"] = None if expires is None or expires >= NO_EXPIRY else datetime.fromtimestamp(expires, tz=UTC)
    values["confidence"] = float(values["confidence"])
    return Hit(**values, score=score)


def _shared_schema() -> list[dict[str, Any]]:
    """The fields of :func:`_shared_fields`, as both collections declare them."""
    return [
        {"name": "id", "type": "string"},
        # Stored, not indexed (so it has to be optional in 0.24.1).
        {"name": "memory_id", "type": "string", "index": False, "optional": True},
        {"name": "tenant", "type": "string", "facet": True},
        # Filtered on instead of the tenant's name (tenant_key); optional only
        # so that an older collection can gain them (migration 25 rewrites its
        # documents). current_key: on a current memory's documents only.
        {"name": "tenant_key", "type": "string", "optional": True},
        {"name": "current_key", "type": "string", "optional": True},
        {"name": "speaker", "type": "string", "index": False, "optional": True},
        {"name": "kind", "type": "string", "facet": True},
        {"name": "tier", "type": "string", "facet": True},
        {"name": "session_id", "type": "string", "facet": True, "optional": True},
        {"name": "tags", "type": "string[]", "facet": True, "optional": True},
        {"name": "created_at", "type": "int64", "sort": True},
        {"name": "confidence", "type": "float"},
        {"name": "importance", "type": "float", "optional": True},
        # Epoch seconds, NO_EXPIRY for none; optional for documents of an older Braid.
        {"name": "expires_at", "type": "int64", "optional": True},
        {"name": "model", "type": "string", "optional": True},
        # Stored, not indexed: shown with the hit.
        {"name": "mem_key", "type": "string", "index": False, "optional": True},
        # Epoch microseconds, NEVER while current (lifecycle_filter). Optional only
        # so that an older collection can gain it; every document written has it.
        {"name": "superseded_at", "type": "int64", "optional": True},
        # Metadata containment tokens (indexers.typesense.metadata).
        {"name": metadata.FIELD, "type": "string[]", "facet": True, "optional": True},
    ]


def collection_schema(name: str) -> dict[str, Any]:
    """The schema of a keyword collection ``name`` holding :func:`record_document`
    documents (no embedding field)."""
    shared = _shared_schema()
    return {
        "name": name,
        "fields": [
            *shared[:3],
            {"name": "content", "type": "string"},
            # Indexed-only text (neighbouring turns): keyword-searched, never shown.
            {"name": "context", "type": "string", "optional": True},
            *shared[3:],
            {"name": "superseded_by", "type": "string", "index": False, "optional": True},
            # The bm25 keyword mode's: the document's terms (document_terms)
            # behind the tenant's key (tenant_terms), what its filters read,
            # and the lengths' means taken by a facet. Optional only so that an
            # older collection can gain them; every document written has them.
            # (An older Braid also sent the bare terms, in a `terms` field
            # that nothing reads now.)
            {"name": "tenant_terms", "type": "string[]", "optional": True},
            # Stored, not indexed: each term's count in the content and the context
            # (document_terms), read by the bm25 ranking instead of the texts.
            {"name": "term_counts", "type": "string", "index": False, "optional": True},
            {"name": "length", "type": "int32", "facet": True, "optional": True},
            {"name": "context_length", "type": "int32", "facet": True, "optional": True},
        ],
    }


def vectors_schema(name: str, dim: int) -> dict[str, Any]:
    """The schema of a vectors collection ``name`` holding :func:`vector_document`
    documents with ``dim``-dimensional embeddings; the content is stored, not
    searched."""
    return {
        "name": name,
        "fields": [
            *_shared_schema(),
            {"name": "content", "type": "string", "index": False, "optional": True},
            {"name": "embedding", "type": "float[]", "num_dim": dim, "optional": True},
        ],
    }


def build_filter(tenant: str, filters: Filters, min_confidence: float, tiers: Sequence[str]) -> str:
    """The full ``filter_by`` of a search. ``tiers`` must not be empty.

    ``created_after``/``created_before`` compare whole seconds, as stored.
    Empty ``tags``/``kinds`` do not restrict (as in Postgres).
    """
    if not tiers:
        raise ValueError("tiers must not be empty")
    return f"{narrow_filter(tenant, filters, tiers)} && confidence:>={float(min_confidence)!r}"


def narrow_filter(tenant: str, filters: Filters, tiers: Sequence[str] | None = None, *, alone: bool = False) -> str:
    """The part of :func:`build_filter` that narrows a tenant's documents: the
    tenant's current ones (``current_key``) or, with ``as_of``, its ones
    current then (``tenant_key`` and the lifecycle clauses), the request's
    filters and ``tiers`` if given; not the confidence floor.

    Typesense 0.24 builds the id list of every filter clause on each search,
    so a clause that matches most of the collection costs as much as a
    selective one; the source leaves out such clauses and checks them on the
    hits instead. ``alone``: the collection holds this tenant's documents
    only (a pair of its own, :mod:`.placement`), where ``current_key`` is
    such a clause, so it is left out (without ``as_of``) and the caller
    checks each hit's ``current_key``. The answer may then be ``""``: no
    filter.
    """
    key = tenant_key(tenant)
    if filters.as_of is None:
        parts = [] if alone else [f"current_key:={key}"]
    else:
        parts = [f"tenant_key:={key}", lifecycle_filter(filters.as_of)]
    if tiers is not None:
        parts.append(f"tier:={quoted_list(tiers)}")
    if filters.kinds:
        parts.append(f"kind:={quoted_list(filters.kinds)}")
    if filters.tags:
        parts.append(f"tags:={quoted_list(filters.tags)}")
    if filters.session_id is not None:
        parts.append(f"session_id:={quoted(filters.session_id)}")
    if filters.created_after is not None:
        parts.append(f"created_at:>={_epoch(filters.created_after)}")
    if filters.created_before is not None:
        parts.append(f"created_at:<={_epoch(filters.created_before)}")
    if filters.metadata:
        # Every token must be there: one clause each (a list in one clause is "any").
        parts += [f"{metadata.FIELD}:={quoted(t)}" for t in metadata.filter_tokens(filters.metadata)]
    if filters.min_importance is not None:
        # Typesense keeps floats as float32, as Postgres' `real` does: 0.7 matches 0.7.
        parts.append(f"importance:>={float(filters.min_importance):.9f}")
    return " && ".join(parts)
