"""Per-source settings: ``sources.<name>`` in YAML, one section per registered source.

Every source has the common keys of :class:`SourceConfig` (its RRF weight
included); a source may declare a subclass with keys of its own. The three
built-in sources have their defaults here; a source registered later
(:func:`register_source_config`, called by ``indexers.registry.register``)
brings its own.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from .base import Section

__all__ = [
    "GraphSourceConfig",
    "PgvectorSourceConfig",
    "SourceConfig",
    "TypesenseSourceConfig",
    "parse_sources",
    "register_source_config",
    "source_defaults",
    "unregister_source_config",
]

log = logging.getLogger("braid.config")

DeadlineMs = Annotated[int, Meta(ge=1, le=60_000)]
#: A share of a list's best score (0: no cut).
Share = Annotated[float, Meta(ge=0.0, le=1.0)]
#: A cosine similarity floor (``None``: no floor).
Similarity = Annotated[float, Meta(ge=-1.0, le=1.0)]


class SourceConfig(Section, frozen=True):
    enabled: bool = True
    #: The source's RRF weight: ``score(d) = sum_s weight_s / (k + rank_s(d))``.
    weight: Annotated[float, Meta(ge=0.0, le=100.0)] = 1.0
    deadline_ms: DeadlineMs = 1000
    candidates: Annotated[int, Meta(ge=1, le=1000)] = 50


class TypesenseSourceConfig(SourceConfig, frozen=True):
    """The Typesense source also searches each query term on its own."""

    #: ``terms``: each query term is searched on its own and the hits ranked
    #: by summed idf (better ranking, one search per term). ``single``: one
    #: search for all the terms, ranked by Typesense (how many terms match).
    #: ``bm25``: one filter for the documents holding the terms, ranked by
    #: Okapi BM25 in Braid (indexers/typesense/bm25.py).
    keyword_mode: Literal["terms", "single", "bm25"] = "bm25"
    #: ``bm25``: the most candidates scored, as a budget of summed document
    #: frequencies (the most common query terms are left out of the filter
    #: beyond it); also the candidate search's page size.
    bm25_candidates: Annotated[int, Meta(ge=1, le=250)] = 150
    #: ``bm25``: the candidate search takes every query term while their
    #: summed document frequencies are within this many times
    #: ``bm25_candidates`` (a document holding several terms is one
    #: candidate: the sum overstates how many there are); should the page
    #: overflow, it is searched again for the rarest terms within
    #: ``bm25_candidates``. 1: those terms at once.
    bm25_union: Annotated[float, Meta(ge=1.0, le=100.0)] = 2.0
    #: ``bm25``: query terms scored (the first ones, stopwords out). More than
    #: ``max_terms``: a term costs a count, not a search.
    bm25_max_terms: Annotated[int, Meta(ge=1, le=32)] = 16
    #: ``bm25``: what an occurrence in the context (and a term of its length)
    #: counts against one in the content (BM25F's field weight).
    bm25_context_weight: Annotated[float, Meta(ge=0.0, le=1.0)] = 1.0
    #: ``bm25``: a memory whose content is longer than this many words
    #: counts its context at ``bm25_context_weight`` × this / its length:
    #: neighbouring turns stand in for what a short memory leaves unsaid, not
    #: for a long one's own words. 0: every context at its full weight.
    bm25_context_words: Annotated[int, Meta(ge=0, le=100_000)] = 80
    #: ``bm25``: a memory's context counts for at most this many words (a
    #: longer one at this / its length, in tf and length): a long context
    #: must not bury a short memory's own words. 0: no cap.
    bm25_context_cap: Annotated[int, Meta(ge=0, le=100_000)] = 0
    #: ``bm25``: ``joint``: a memory's content and context are one text, of
    #: one length against one mean length. ``each``: each is normalised by
    #: its own length against its own mean before they are weighted and
    #: summed (BM25F), so a long context does not dilute a short content.
    bm25_field_lengths: Literal["joint", "each"] = "joint"
    #: ``bm25`` with ``bm25_field_lengths`` ``each``: BM25's ``b`` (how much a
    #: field's length against its mean counts, 0-1) of the content and of the context.
    bm25_field_b: tuple[Share, Share] = (0.75, 0.75)
    #: How long a count Typesense made for the keyword ranking (a filter's
    #: document count and mean lengths, a term's document frequency) is
    #: reused, in ms (0: counted again by every recall). ``bm25``: past it a
    #: filter's last counts stand in while one recall at a time counts again.
    count_ttl_ms: Annotated[int, Meta(ge=0, le=86_400_000)] = 10_000
    #: ``bm25``: a term's document frequency is reused past ``count_ttl_ms``
    #: (for up to an hour) while the number of documents behind the recall's
    #: filter, counted again every ``count_ttl_ms``, is within this fraction
    #: of what it was when the frequency was counted (0: ``count_ttl_ms`` only).
    count_drift: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.01
    #: Query terms searched one by one for the keyword list (the first ones).
    max_terms: Annotated[int, Meta(ge=1, le=32)] = 8
    #: Hits fetched per term search: Typesense's time grows with it.
    term_hits: Annotated[int, Meta(ge=1, le=250)] = 50
    #: ``always``: the source runs its own vector search in every recall.
    #: ``alone``: only in recalls where no other source covers the vectors.
    vector_search: Literal["always", "alone"] = "alone"
    #: ``bm25``: a keyword candidate scoring below this share of the best
    #: candidate's BM25 is left out of the keyword list (0: every document
    #: holding a query term stays).
    relative_floor: Share = 0.25
    #: The vector list keeps only memories at least this cosine-similar to the
    #: query (below it a memory was not matched, only listed); ``None``: all.
    min_similarity: Similarity | None = 0.15


class PgvectorSourceConfig(SourceConfig, frozen=True):
    """The pgvector source's floors: what it returns must be near the query."""

    #: Memories less cosine-similar to the query than this are not returned
    #: (``None``: no floor).
    min_similarity: Similarity | None = 0.15
    #: Nor those below this share of the best hit's similarity.
    relative_floor: Share = 0.3


class GraphSourceConfig(SourceConfig, frozen=True):
    """The graph source's floor: what the walk reached only faintly stays out."""

    #: Memories whose score (the PageRank share the walk passed them) is below
    #: this share of the best memory's are not returned.
    relative_floor: Share = 0.05


#: Defaults of each registered source, in the order recalls report them.
_DEFAULTS: dict[str, SourceConfig] = {
    "typesense": TypesenseSourceConfig(),
    "pgvector": PgvectorSourceConfig(),
    # The graph's list overlaps the keyword list, so it counts less.
    "graph": GraphSourceConfig(weight=0.3),
}


def register_source_config(name: str, default: SourceConfig) -> None:
    """Make ``sources.<name>`` a known section, with ``default`` as its defaults."""
    if name in _DEFAULTS and _DEFAULTS[name] != default:
        raise ValueError(f"source {name!r} is already registered with other defaults")
    _DEFAULTS[name] = default


def unregister_source_config(name: str) -> None:
    _DEFAULTS.pop(name, None)


def source_defaults() -> dict[str, SourceConfig]:
    """Every registered source's defaults (a new dict; the sections are frozen)."""
    return dict(_DEFAULTS)


def parse_sources(raw: Any, legacy_weights: Any = None) -> dict[str, SourceConfig]:
    """``sources`` and the deprecated ``rrf.weights`` from YAML, over the defaults.

    Raises ``ValueError`` with the path of the bad key.
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"Expected `object`, got `{type(raw).__name__}` - at `$.sources`")
    out = source_defaults()
    for name, section in raw.items():
        if name not in out:
            raise ValueError(f"unknown source {name!r}; sources are {list(out)} - at `$.sources`")
        out[name] = _merge(out[name], section, f"$.sources.{name}")
    if legacy_weights is not None:
        if not isinstance(legacy_weights, Mapping):
            raise ValueError("Expected `object` - at `$.rrf.weights`")
        unknown = sorted(set(legacy_weights) - set(out))
        if unknown:
            raise ValueError(f"rrf.weights names unknown source(s) {unknown}; known: {list(out)}")
        log.warning("rrf.weights is deprecated and will be removed: use sources.<name>.weight")
        for name, weight in legacy_weights.items():
            given = raw.get(name)
            if isinstance(given, Mapping) and "weight" in given:
                continue  # the new key wins
            out[name] = _merge(out[name], {"weight": weight}, f"$.rrf.weights.{name}", key="weight")
    return out


def _merge(default: SourceConfig, section: Any, path: str, key: str | None = None) -> SourceConfig:
    if not isinstance(section, Mapping):
        raise ValueError(f"Expected `object`, got `{type(section).__name__}` - at `{path}`")
    base = msgspec.to_builtins(default)
    try:
        return msgspec.convert({**base, **section}, type(default), strict=True)
    except msgspec.ValidationError as exc:
        message = str(exc)
        if " - at `$" in message:
            head, _, rest = message.rpartition(" - at `$")
            if key is not None:  # a single value given under another path
                rest = rest.removeprefix(f".{key}")
            raise ValueError(f"{head} - at `{path}{rest}") from None
        raise ValueError(f"{message} - at `{path}`") from None
