"""The keyword side of a Typesense search: the query's terms and their idf ranking.

Typesense 0.24.1 ranks a multi-word query by how many words match, not by
their rarity, and drops tokens (``drop_tokens_threshold``) from the right,
then from the left, never around a word in the middle. So the keyword query
leaves out common English words (:func:`keyword_query`), or "what is the
password" would rank "what is the plan" above "the password is Blue"; and
the source searches each term alone and ranks documents by the summed idf of
the terms that found them (:func:`idf_ranking`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "COUNT_CACHE_SIZE",
    "COUNT_TTL_S",
    "MAX_TERMS",
    "STOPWORDS",
    "TtlCache",
    "idf_ranking",
    "keyword_query",
    "keyword_terms",
]

#: Query terms searched one by one (``sources.typesense.maxTerms`` in the config).
MAX_TERMS = 8

#: How long the count of documents behind a filter (the idf's N) is reused,
#: and for how many filters at most.
COUNT_TTL_S = 10.0
COUNT_CACHE_SIZE = 4096

#: Function words left out of keyword queries (see the module docstring).
STOPWORDS = frozenset(
    """
    a about after again all am an and any are as at be been before being but by
    can could did do does doing done for from had has have having he her here
    hers him his how i if in into is it its me my myself no nor not of on or
    our ours out over she should so some such than that the their theirs them
    then there these they this those through to too under until up very was we
    were what when where which while who whom why will with would you your
    yours yourself whats thats im ive dont didnt doesnt isnt wasnt
    """.split()
)


def keyword_query(text: str) -> str:
    """The ``q`` of the keyword search for a natural-language query.

    Words are kept as typed except that ``"`` and a leading ``-`` (Typesense's
    phrase and exclusion operators) are removed, and so are :data:`STOPWORDS`
    unless nothing else is left. Empty means "no keyword search".
    """
    words = [w.lstrip("-").replace('"', "") for w in text.split()]
    words = [w for w in words if any(c.isalnum() for c in w)]
    content = [w for w in words if "".join(c for c in w if c.isalnum()).lower() not in STOPWORDS]
    return " ".join(content or words)


def keyword_terms(text: str, cap: int = MAX_TERMS) -> list[str]:
    """The distinct terms of :func:`keyword_query`, normalised as Typesense
    indexes them (alphanumerics only, lower case), at most ``cap``."""
    terms: list[str] = []
    for word in keyword_query(text).split():
        term = "".join(c for c in word if c.isalnum()).lower()
        if term and term not in terms:
            terms.append(term)
    return terms[:cap]


def idf_ranking(term_results: Sequence[Mapping[str, Any]], total: int) -> list[str]:
    """Memory ids ranked by the summed idf of the term searches that found them.

    ``idf = ln(1 + (N - df + 0.5) / (df + 0.5))`` with ``df`` each search's
    ``found``; ties go to the document that ranked best in any term search.
    """
    scores: dict[str, float] = {}
    first: dict[str, tuple[int, int]] = {}
    for ti, result in enumerate(term_results):
        df = int(result.get("found", 0))
        idf = math.log(1.0 + (total - df + 0.5) / (df + 0.5))
        for pos, hit in enumerate(result.get("hits", [])):
            mid = hit["document"]["memory_id"]
            scores[mid] = scores.get(mid, 0.0) + idf
            first.setdefault(mid, (pos, ti))
    return sorted(scores, key=lambda m: (-scores[m], first[m], m))


class TtlCache:
    """A small dict whose entries expire ``ttl`` seconds after they were put;
    when full it starts over (no LRU bookkeeping on the request path)."""

    def __init__(self, ttl: float, size: int) -> None:
        self.ttl = ttl
        self.size = size
        self._items: dict[str, tuple[float, int]] = {}

    def get(self, key: str) -> int | None:
        """The value put under ``key``, or ``None`` if none or expired."""
        item = self._items.get(key)
        if item is None or item[0] < time.monotonic():
            return None
        return item[1]

    def put(self, key: str, value: int) -> None:
        """Keep ``value`` under ``key`` for ``ttl`` seconds."""
        if len(self._items) >= self.size:
            self._items.clear()
        self._items[key] = (time.monotonic() + self.ttl, value)
