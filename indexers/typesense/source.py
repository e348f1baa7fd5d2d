"""The search side of the Typesense index: the ``typesense`` recall source.

Typesense 0.24.1 refuses ``q`` together with ``vector_query``, so a search is
several searches in one ``POST /multi_search`` (keyword, vector), fused here
with :func:`fusion.rrf.rrf`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from config import BraidConfig, TypesenseSourceConfig, source_defaults
from fusion.rrf import rrf

from ..base import Hit, SearchQuery
from ..registry import SourceSpec, register
from .client import SOURCE, TypesenseClient
from .documents import narrow_filter, vector_literal
from .keywords import COUNT_CACHE_SIZE, COUNT_TTL_S, TtlCache, idf_ranking, keyword_terms

__all__ = ["MAX_PER_PAGE", "TypesenseSource"]

#: Typesense refuses ``per_page`` above this ("Only upto 250 hits ...").
MAX_PER_PAGE = 250

#: The fields a search hit needs; the embedding is never sent back.
_HIT_FIELDS = "memory_id,content,kind,tier,created_at,confidence,speaker"


class TypesenseSource:
    """Keyword and vector search over ``alias``, fused with RRF.

    The configuration is read at every search, so a reload applies at once.
    The client belongs to whoever created it: :meth:`aclose` leaves it open.
    """

    name = SOURCE
    #: Without a vector it still answers with its keyword list.
    needs_vector = False

    def __init__(
        self, client: TypesenseClient, alias: str, get_config: Callable[[], BraidConfig]
    ) -> None:
        self.client = client
        self.alias = alias
        self._get_config = get_config
        self._totals = TtlCache(COUNT_TTL_S, COUNT_CACHE_SIZE)

    async def search(self, query: SearchQuery) -> list[Hit]:
        config = self._get_config()
        wanted = query.filters.tiers
        tiers = [t for t in config.memory_tiers if wanted is None or t in wanted]
        if query.limit < 1 or not tiers:
            return []
        # Typesense narrows to the tenant and the request's filters; the tier
        # list (unless the request restricts tiers) and the confidence floor,
        # which match nearly every document, are checked on the hits.
        filter_by = narrow_filter(query.tenant, query.filters, None if wanted is None else tiers)
        allowed = frozenset(tiers)
        floor = query.min_confidence

        def allowed_doc(doc: Mapping[str, Any]) -> bool:
            return doc["tier"] in allowed and doc["confidence"] >= floor

        ts = config.source(SOURCE)
        assert isinstance(ts, TypesenseSourceConfig)
        candidates = min(ts.candidates, MAX_PER_PAGE)
        # Keyword: one search per query term, each document scored by the summed
        # idf of the terms that found it (Typesense 0.24 ranks a multi-word query
        # by how many words match, not by their rarity). The idf's N, the number
        # of documents the filter allows, is counted by one more search and
        # reused for a few seconds. Vector: one k-NN search. All in a single
        # multi_search.
        terms = keyword_terms(query.text, ts.max_terms)
        single = ts.keyword_mode == "single"
        searches: list[dict[str, Any]] = [
            {
                "q": term,
                "query_by": "content,context",
                "prefix": True,
                "num_typos": 1,
                "drop_tokens_threshold": 0,
                "typo_tokens_threshold": 1,
                "per_page": ts.term_hits,
                "highlight_fields": "none",
            }
            for term in ([" ".join(terms)] if single and terms else terms)
        ]
        if single and searches:
            # Drop words (right to left) until `candidates` documents match.
            searches[0].update(drop_tokens_threshold=candidates, per_page=candidates)
        total = self._totals.get(filter_by) if terms and not single else None
        count_at = -1
        if terms and not single and total is None:
            count_at = len(searches)
            searches.append({"q": "*", "per_page": 0})
        # `alone`: leave vector search to a source that covers the vectors.
        if query.vector is not None and (ts.vector_search == "always" or not query.vectors_covered):
            vector = vector_literal(query.vector)
            searches.append(
                {
                    "q": "*",
                    "vector_query": f"embedding:([{vector}], k:{candidates})",
                    "per_page": candidates,
                }
            )
        if not searches:
            return []
        common = {"collection": self.alias, "filter_by": filter_by, "include_fields": _HIT_FIELDS}
        results = await self.client.multi_search([{**common, **s} for s in searches])

        # Hits outside the allowed tiers or under the confidence floor go first.
        docs: dict[str, dict[str, Any]] = {}
        for result in results:
            result["hits"] = [h for h in result.get("hits", []) if allowed_doc(h["document"])]
            for h in result["hits"]:
                docs.setdefault(h["document"]["memory_id"], h["document"])
        rankings: dict[str, list[str]] = {}
        if single and terms:
            rankings["keyword"] = [h["document"]["memory_id"] for h in results[0]["hits"]]
        elif terms:
            if total is None:
                total = int(results[count_at].get("found", 0))
                self._totals.put(filter_by, total)
            rankings["keyword"] = idf_ranking(results[: len(terms)], total)[:candidates]
        if query.vector is not None:
            rankings["vector"] = [h["document"]["memory_id"] for h in results[-1]["hits"]]
        weight = config.rrf.vector_weight
        fused = rrf(rankings, k=config.rrf.k, weights={"vector": weight, "keyword": 1.0 - weight})
        return [
            Hit(
                id=f.id,
                content=docs[f.id]["content"],
                kind=docs[f.id]["kind"],
                tier=docs[f.id]["tier"],
                created_at=datetime.fromtimestamp(docs[f.id]["created_at"], tz=timezone.utc),
                confidence=float(docs[f.id]["confidence"]),
                score=f.score,
                speaker=docs[f.id].get("speaker"),
            )
            for f in fused[: query.limit]
        ]

    async def aclose(self) -> None:
        """Nothing to release: the client is closed by its owner."""


register(
    SourceSpec(
        name=SOURCE,
        build=lambda deps: TypesenseSource(deps.typesense, deps.get_config().typesense.collection, deps.get_config),
        defaults=source_defaults()[SOURCE],
        store="typesense",
    )
)
