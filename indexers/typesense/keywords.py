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

import functools
import math
import re
import threading
import time
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import Stemmer

__all__ = [
    "COUNT_CACHE_SIZE",
    "COUNT_TTL_S",
    "MAX_TERMS",
    "STEM",
    "STOPWORDS",
    "TtlCache",
    "bm25_terms",
    "idf",
    "idf_ranking",
    "is_own_stem",
    "keyword_query",
    "keyword_terms",
    "normalised_text",
    "stems",
    "term_count",
    "text_terms",
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


#: What a term is stripped of: everything neither alphanumeric (``str.isalnum``,
#: which is ``\w`` without ``_``) nor whitespace.
_NOT_TERM = re.compile(r"[^\w\s]|_")


def _normalise(word: str) -> str:
    """A word as a term: alphanumerics only, lower case (may be empty)."""
    return _NOT_TERM.sub("", word).lower()


#: The ASCII characters :data:`_NOT_TERM` matches, for ``str.translate``
#: (ten times faster than the regular expression on ASCII text).
_ASCII_NOT_TERM = str.maketrans("", "", "".join(c for c in map(chr, range(128)) if _NOT_TERM.match(c)))


def normalised_text(text: str) -> str:
    """``text`` with every word normalised as a term (whitespace kept), so
    that its terms are ``normalised_text(text).split()``."""
    return text.translate(_ASCII_NOT_TERM).lower() if text.isascii() else _normalise(text)


def term_count(normalised: str, term: str) -> int:
    """How many times ``term`` is a whole word of a :func:`normalised_text`
    (``normalised.split().count(term)`` without splitting)."""
    count = 0
    size = len(term)
    end = len(normalised)
    at = normalised.find(term)
    while at >= 0:
        after = at + size
        if (at == 0 or normalised[at - 1].isspace()) and (after == end or normalised[after].isspace()):
            count += 1
        at = normalised.find(term, after)
    return count


def text_terms(text: str) -> list[str]:
    """Every term of ``text`` in order, repeats and stopwords included: its
    whitespace-separated words normalised as :func:`keyword_terms` normalises
    a query's (one pass over the whole text; the same terms as word by word)."""
    return normalised_text(text).split()


def keyword_query(text: str) -> str:
    """The ``q`` of the keyword search for a natural-language query.

    Words are kept as typed except that ``"`` and a leading ``-`` (Typesense's
    phrase and exclusion operators) are removed, and so are :data:`STOPWORDS`
    unless nothing else is left. Empty means "no keyword search".
    """
    words = [w.lstrip("-").replace('"', "") for w in text.split()]
    words = [w for w in words if any(c.isalnum() for c in w)]
    content = [w for w in words if _normalise(w) not in STOPWORDS]
    return " ".join(content or words)


def keyword_terms(text: str, cap: int = MAX_TERMS) -> list[str]:
    """The distinct terms of :func:`keyword_query`, normalised as Typesense
    indexes them (alphanumerics only, lower case), at most ``cap``."""
    terms: list[str] = []
    for word in keyword_query(text).split():
        term = _normalise(word)
        if term and term not in terms:
            terms.append(term)
    return terms[:cap]


_STEMMERS = threading.local()

#: Before a stem in the ``bm25`` mode's terms (:func:`bm25_terms`) and in a
#: document's ``term_counts``: a term of the stem field. Never part of a
#: normalised word (alphanumerics only).
STEM = "~"


def stems(words: Sequence[str]) -> list[str]:
    """Each of ``words`` (normalised: :func:`text_terms`) as its English
    Snowball stem ("porter2", PyStemmer), in order: ``researched`` and
    ``researching`` are ``research``, ``paints`` and ``painting`` ``paint``.
    Digits and words it has no rule for stay as they are. A stemmer is not
    shared between threads."""
    try:
        stemmer = _STEMMERS.english
    except AttributeError:
        stemmer = _STEMMERS.english = Stemmer.Stemmer("english")
    stemmed: list[str] = stemmer.stemWords(words)
    return stemmed


@functools.lru_cache(maxsize=65_536)
def is_own_stem(word: str) -> bool:
    """Whether ``word`` is its own stem (``paint``, ``research``; not ``paints``)."""
    return stems([word])[0] == word


def bm25_terms(text: str, cap: int = MAX_TERMS) -> list[str]:
    """The ``bm25`` mode's query terms: the words of :func:`keyword_terms`
    (at most ``cap``), then each of their distinct stems behind :data:`STEM`.
    A document matches a word's term by that word only, and a stem's term by
    any word with that stem (:func:`~.documents.document_terms`), so the
    exact form counts twice and another form once (two fields of one BM25,
    as Lucene scores a stemmed and an unstemmed field)."""
    words = keyword_terms(text, cap)
    return words + [STEM + s for s in dict.fromkeys(stems(words))]


def idf(df: int, total: int) -> float:
    """``ln(1 + (N - df + 0.5) / (df + 0.5))`` (BM25's idf as Lucene has it:
    never negative), with ``N`` at least ``df`` (a cached count can be older)."""
    total = max(total, df)
    return math.log(1.0 + (total - df + 0.5) / (df + 0.5))


def idf_ranking(term_results: Sequence[Mapping[str, Any]], total: int) -> list[str]:
    """Memory ids ranked by the summed idf of the term searches that found them.

    ``idf = ln(1 + (N - df + 0.5) / (df + 0.5))`` with ``df`` each search's
    ``found``; ties go to the document that ranked best in any term search.
    """
    scores: dict[str, float] = {}
    first: dict[str, tuple[int, int]] = {}
    for ti, result in enumerate(term_results):
        weight = idf(int(result.get("found", 0)), total)
        for pos, hit in enumerate(result.get("hits", [])):
            mid = hit["document"]["memory_id"]
            scores[mid] = scores.get(mid, 0.0) + weight
            first.setdefault(mid, (pos, ti))
    return sorted(scores, key=lambda m: (-scores[m], first[m], m))


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    """A small dict whose entries expire ``ttl`` seconds after they were put;
    when full it starts over (no LRU bookkeeping on the request path)."""

    def __init__(self, ttl: float, size: int) -> None:
        self.ttl = ttl
        self.size = size
        self._items: dict[K, tuple[float, V]] = {}

    def get(self, key: K) -> V | None:
        """The value put under ``key``, or ``None`` if none or expired."""
        item = self._items.get(key)
        if item is None or item[0] <= time.monotonic():
            return None
        return item[1]

    def put(self, key: K, value: V, ttl: float | None = None) -> None:
        """Keep ``value`` under ``key`` for ``ttl`` seconds (default: the cache's)."""
        if len(self._items) >= self.size:
            self._items.clear()
        self._items[key] = (time.monotonic() + (self.ttl if ttl is None else ttl), value)
