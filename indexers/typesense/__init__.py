"""Typesense: the keyword + vector index of memories, fed from Postgres.

One job a module, each usable alone:

* :mod:`.client`: :class:`TypesenseClient`, the async REST client with node
  failover, and :class:`TypesenseError`.
* :mod:`.documents`: a memory as a document, its id, the collection schema
  and the ``filter_by`` expressions.
* :mod:`.index`: :class:`TypesenseIndex`, the write/admin side used by the
  outbox and reindex (versioned collections behind an alias).
* :mod:`.groups`: :class:`TypesenseGroups`, tenants spread over several
  such collection pairs by a hash of their names (``typesense.groups``).
* :mod:`.placement`: the tenants moved to pairs of their own, as this
  process last read them (the move itself: :mod:`indexers.placement`).
* :mod:`.keywords`: the keyword terms of a query and their idf ranking.
* :mod:`.bm25`: the ``bm25`` keyword mode (one filtered search, Okapi BM25
  computed here over its candidates).
* :mod:`.source`: :class:`TypesenseSource`, the search side (the
  :class:`~indexers.base.Source` protocol); importing this package registers
  it as the ``typesense`` source.

What Typesense 0.24.1 does that these modules work around is noted where it
matters, and at more length in the Typesense section of ``docs/design.md``.
"""

from __future__ import annotations

from .client import TypesenseClient, TypesenseError, import_groups
from .documents import build_filter, narrow_filter
from .groups import TypesenseGroups
from .index import TypesenseIndex
from .keywords import COUNT_TTL_S, STOPWORDS, idf_ranking, keyword_query, keyword_terms
from .source import TypesenseSource

__all__ = [
    "COUNT_TTL_S",
    "STOPWORDS",
    "TypesenseClient",
    "TypesenseError",
    "TypesenseGroups",
    "TypesenseIndex",
    "TypesenseSource",
    "build_filter",
    "idf_ranking",
    "import_groups",
    "keyword_query",
    "keyword_terms",
    "narrow_filter",
]
