"""The search side of the Typesense index: the ``typesense`` recall source.

Typesense 0.24.1 refuses ``q`` together with ``vector_query``, so a search is
several searches in one ``POST /multi_search`` (keyword searches in the
keyword collection, the vector search in the vectors collection: see
:mod:`.index`), fused here with :func:`fusion.rrf.rrf`. Each search is sent with a role, and each result
is read by the role of the search it answers, never by its position.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from config import BraidConfig, TypesenseSourceConfig, source_defaults
from fusion.rrf import rrf, rrf_one

from ..base import SHOWN_FIELDS, Filters, Hit, MemoryRecord, SearchQuery
from ..lifecycle import Forgetting
from ..registry import SourceSpec, register
from .bm25 import CANDIDATES as BM25_CANDIDATES
from .bm25 import Bm25Keywords, Bm25Plan
from .client import SOURCE, TypesenseClient
from .documents import (
    NO_EXPIRY,
    combined_document,
    document_field,
    group_alias,
    hit_from_document,
    narrow_filter,
    tenant_key,
    term_key,
    vector_literal,
    vectors_alias,
)
from .keywords import COUNT_CACHE_SIZE, COUNT_TTL_S, TtlCache, bm25_terms, idf_ranking, keyword_terms
from .placement import own_alias

__all__ = ["KEYED_S", "MAX_PER_PAGE", "SUPERSEDED_SHARE", "TypesenseSource"]

#: In a tenant's own pair, when more than this share of the hits of a
#: search's full pages were superseded documents (kept for ``as_of``), the
#: search is sent again naming the tenant's ``current_key``, and so are its
#: searches for :data:`KEYED_S` seconds: the filter is dearer, but
#: superseded documents no longer take the candidate slots.
SUPERSEDED_SHARE = 0.1
KEYED_S = 600.0

#: Typesense refuses ``per_page`` above this ("Only upto 250 hits ...").
MAX_PER_PAGE = 250

#: The fields a search hit needs (and its tenant, checked); the embedding is never sent back.
_HIT_FIELDS = ",".join([*(document_field(name) for name in SHOWN_FIELDS), "tenant"])

#: A bm25 candidate's: the hit's, each term's counts and the lengths (a document
#: written before it had counts is counted in its content alone until migration 14
#: has rewritten it).
_BM25_FIELDS = f"{_HIT_FIELDS},term_counts,length,context_length"


#: What a hit needs besides for the request's string filters to be checked on it.
_FILTER_FIELDS = ",session_id,tags"


def _exact(filters: Filters) -> Callable[[Mapping[str, Any]], bool] | None:
    """The request's kinds, tags and session id as Postgres compares them
    (Typesense's ``:=`` folds case and drops ``-`` and ``_``: ``s-1`` also
    matches ``s1``), as a check of a hit's document; ``None``: none to check."""
    kinds = frozenset(filters.kinds) if filters.kinds else None
    tags = frozenset(filters.tags) if filters.tags else None
    session = filters.session_id
    if kinds is None and tags is None and session is None:
        return None

    def exact(doc: Mapping[str, Any]) -> bool:
        return (
            (kinds is None or doc.get("kind") in kinds)
            and (session is None or doc.get("session_id") == session)
            and (tags is None or not tags.isdisjoint(doc.get("tags") or ()))
        )

    return exact


def _keyword_search(q: str, per_page: int, drop_tokens: int = 0) -> dict[str, Any]:
    """A keyword search for ``q`` in the content and its context that drops
    words (right to left) until ``drop_tokens`` documents match."""
    return {
        "q": q,
        "query_by": "content,context",
        "prefix": True,
        "num_typos": 1,
        "drop_tokens_threshold": drop_tokens,
        "typo_tokens_threshold": 1,
        "per_page": per_page,
        "highlight_fields": "none",
    }


def _ids(result: Mapping[str, Any]) -> list[str]:
    """The memory ids of a result's hits, in its order."""
    return [h["document"]["memory_id"] for h in result["hits"]]


class TypesenseSource:
    """Keyword search over the alias ``route`` names for the tenant, on the
    cluster it names (by default ``client`` and the tenant's group's alias,
    ``alias`` itself with one group: :func:`~.documents.group_alias`; the
    runtime's route also knows the further clusters and the tenants moved to
    pairs of their own), and vector search over its vectors alias
    (:func:`~.documents.vectors_alias`), fused with RRF.

    The configuration is read at every search, so a reload applies at once.
    The client belongs to whoever created it: :meth:`aclose` leaves it open.
    """

    name = SOURCE
    #: Without a vector it still answers with its keyword list.
    needs_vector = False

    def __init__(
        self,
        client: TypesenseClient,
        alias: str,
        get_config: Callable[[], BraidConfig],
        *,
        groups: int = 1,
        route: Callable[[str], tuple[TypesenseClient, str]] | None = None,
        rewrite: Callable[[], bool] | None = None,
    ) -> None:
        self.client = client
        #: While it returns true, the bm25 filters also name each term behind
        #: the tenant's whole key, as documents written before migration 26
        #: hold it (``None``: never).
        self.rewrite = rewrite
        self.alias = alias
        self.groups = groups
        #: Where a tenant's searches go: a client and an alias (default:
        #: ``client`` and the tenant's group's).
        self.route = route or functools.partial(_group_of, client, alias, groups)
        self._get_config = get_config
        self._totals: TtlCache[str, int] = TtlCache(COUNT_TTL_S, COUNT_CACHE_SIZE)
        self._bm25 = Bm25Keywords()
        #: Tenants in pairs of their own whose searches name their
        #: current_key again (:data:`SUPERSEDED_SHARE`).
        self._keyed: TtlCache[str, bool] = TtlCache(KEYED_S, COUNT_CACHE_SIZE)
        #: The multi_searches carrying counts, until they answer: a recall
        #: that gave up waiting leaves its call here (:meth:`_counted`).
        self._late: set[asyncio.Future[list[dict[str, Any]]]] = set()

    async def search(self, query: SearchQuery) -> list[Hit]:
        return await self.search_first(query, functools.partial(_given, query.unindexed))

    async def search_first(
        self, query: SearchQuery, unindexed: Callable[[], Awaitable[tuple[MemoryRecord, ...]]]
    ) -> list[Hit]:
        """:meth:`search` with the recall's unindexed memories awaited only
        once the searches came back (:class:`~indexers.base.SearchesFirst`)."""
        config = self._get_config()
        wanted = query.filters.tiers
        tiers = [t for t in config.memory_tiers if wanted is None or t in wanted]
        if query.limit < 1 or not tiers:
            return []
        client, alias = self.route(query.tenant)
        # Typesense narrows to the tenant and the request's filters; the tier
        # list (unless the request restricts tiers), the confidence floor and
        # expiry, which match nearly every document, are checked on the hits
        # (expired documents are few: the sweeper deletes them). So is the
        # tenant's current_key in a pair of its own, where every document is
        # the tenant's and nearly all are current
        # (benchmarks/results/typesense-key-clause.md); while superseded
        # documents fill too many hits, the filter names it again.
        alone = alias == own_alias(self.alias, query.tenant) and self._keyed.get(query.tenant) is None
        filter_by = narrow_filter(query.tenant, query.filters, None if wanted is None else tiers, alone=alone)
        # The counts are cached per filter, and per tenant where none names it.
        scope = f"{tenant_key(query.tenant)}:{filter_by}" if alone else filter_by
        current = tenant_key(query.tenant) if alone and query.filters.as_of is None else None
        allowed = frozenset(tiers)
        floor = query.min_confidence
        forgetting = Forgetting.from_config(config)
        ages = forgetting.ages
        now = time.time()
        tenant = query.tenant
        exact = _exact(query.filters)
        extra = ("" if exact is None else _FILTER_FIELDS) + ("" if current is None else ",current_key")

        def allowed_doc(doc: Mapping[str, Any]) -> bool:
            # The filter names the tenant by its key; its name, compared
            # exactly, keeps another tenant's document out whatever happens.
            if doc.get("tenant") != tenant or doc["tier"] not in allowed or doc["confidence"] < floor:
                return False
            if exact is not None and not exact(doc):
                return False
            if current is not None and doc.get("current_key") != current:
                return False  # superseded: its filter left it in
            expires = doc.get("expires_at")
            if not ages:  # only its expires_at can end it
                return expires is None or expires >= NO_EXPIRY or now < expires
            dies_at = forgetting.dies_at(
                tier=doc["tier"],
                created_s=doc["created_at"],
                importance=doc.get("importance"),
                expires_s=None if expires is None or expires >= NO_EXPIRY else expires,
            )
            return now < dies_at

        ts = config.source(SOURCE)
        assert isinstance(ts, TypesenseSourceConfig)
        candidates = min(ts.candidates, MAX_PER_PAGE)
        # A semantic recall (vector only) searches no terms.
        cap = ts.bm25_max_terms if ts.keyword_mode == "bm25" else ts.max_terms
        # With typesense.stems, bm25 scores words and their stems (two fields).
        stems = config.typesense.stems
        query_terms = bm25_terms if ts.keyword_mode == "bm25" and stems else keyword_terms
        terms = query_terms(query.text, cap) if "keyword" in query.matches else []
        total = self._totals.get(scope) if terms and ts.keyword_mode == "terms" else None
        bm25: Bm25Plan | None = None
        if terms and ts.keyword_mode == "bm25":
            bm25 = self._bm25.plan(
                filter_by,
                term_key(tenant),
                terms,
                ts.bm25_candidates,
                ts.bm25_context_weight,
                _BM25_FIELDS + extra,
                ts.count_ttl_ms / 1000.0,
                legacy_key=tenant_key(tenant) if self.rewrite is not None and self.rewrite() else None,
                scope=scope,
                drift=ts.count_drift,
                union=ts.bm25_union,
                context_words=ts.bm25_context_words,
                field_lengths=ts.bm25_field_lengths,
                field_b=ts.bm25_field_b,
                context_cap=ts.bm25_context_cap,
            )
        vectors = vectors_alias(alias) if config.typesense.vectors == "separate" else None
        searches = _searches(
            query, ts, terms, candidates, count=total is None, bm25=bm25, vectors=vectors, extra_fields=extra
        )
        if not searches:
            return []
        common = {"collection": alias, "include_fields": _HIT_FIELDS + extra}
        if filter_by:
            common["filter_by"] = filter_by
        bodies = [{**common, **search} for _, search in searches]
        roles = [role for role, _ in searches]
        if bm25 is not None and bm25.counting:
            answers = await self._counted(client, bodies, bm25, roles)
        else:
            answers = await client.multi_search(bodies)
        answered = dict(zip(roles, answers, strict=True))
        sent = dict(searches)
        if bm25 is not None and (again := bm25.learn(answered)) is not None:
            # A cold cache's candidate search overflowed: once more, for the
            # terms the counts that came back choose.
            answered[again[0]] = (await client.multi_search([{**common, **again[1]}]))[0]
            sent[again[0]] = again[1]
        if current is not None and _superseded_share(answered, sent, current) > SUPERSEDED_SHARE:
            # Superseded documents took too many slots: this search and the
            # tenant's next ones for KEYED_S name its current_key.
            self._keyed.put(tenant, True)
            return await self.search_first(query, unindexed)

        # Hits outside the allowed tiers or under the confidence floor go first,
        # and so do the documents of memories rewritten since (their outbox rows
        # pending): the memory as stored now stands in for them, as one
        # document with its terms and, if read, its embedding.
        pending = {r.id: combined_document(r, stems=stems) for r in await unindexed()}
        results: dict[str, dict[str, Any]] = {
            role: {
                **answer,
                "hits": [
                    h
                    for h in answer.get("hits", [])
                    if allowed_doc(h["document"]) and h["document"]["memory_id"] not in pending
                ],
            }
            for role, answer in answered.items()
        }
        docs: dict[str, dict[str, Any]] = dict(pending)
        for result in results.values():
            for h in result["hits"]:
                docs.setdefault(h["document"]["memory_id"], h["document"])
        rankings: dict[str, list[str]] = {}
        if "single" in results:
            rankings["keyword"] = _ids(results["single"])
        elif bm25 is not None:
            found = [h["document"] for h in results[BM25_CANDIDATES]["hits"]]
            # Not in Typesense yet: scored as the candidate search would have found them.
            found += [d for d in pending.values() if bm25.holds_sent(d)]
            rankings["keyword"] = bm25.ranking(found, ts.relative_floor)[:candidates]
        elif terms:
            if total is None:
                total = int(results["count"].get("found", 0))
                self._totals.put(scope, total, ts.count_ttl_ms / 1000.0)
            rankings["keyword"] = idf_ranking([results[f"term:{t}"] for t in terms], total)[:candidates]
        if "vector" in results and query.vector is not None:
            rankings["vector"] = _vector_ranking(
                results["vector"]["hits"], query, pending.values(), ts.min_similarity, candidates
            )
        weight = config.rrf.vector_weight
        weights = {"vector": weight, "keyword": 1.0 - weight}
        if len(rankings) == 1:
            # One list (the keyword list, when pgvector covers the vectors):
            # RRF keeps its order, so only the scores are computed.
            ((role, ids),) = rankings.items()
            one = rrf_one(ids, k=config.rrf.k, weight=weights[role], limit=query.limit)
            return [hit_from_document(docs[memory_id], score) for memory_id, score in one]
        fused = rrf(rankings, k=config.rrf.k, weights=weights)
        return [hit_from_document(docs[f.id], f.score) for f in fused[: query.limit]]

    async def _counted(
        self, client: TypesenseClient, bodies: list[dict[str, Any]], plan: Bm25Plan, roles: list[str]
    ) -> list[dict[str, Any]]:
        """``client.multi_search(bodies)``, whose counts ``plan`` learns when
        it answers even if the recall stopped waiting for it (its deadline):
        Typesense does the work either way, and a recall that gave up must
        not leave the caches as cold for the next one (under load each late
        recall would otherwise send the same counts again)."""
        call = asyncio.ensure_future(client.multi_search(bodies))
        self._late.add(call)
        call.add_done_callback(functools.partial(self._answered, plan, roles))
        return await asyncio.shield(call)

    def _answered(self, plan: Bm25Plan, roles: list[str], call: asyncio.Future[list[dict[str, Any]]]) -> None:
        self._late.discard(call)
        if call.cancelled() or call.exception() is not None:
            plan.unanswered()  # the recall, if still waiting, gets the error
        else:
            plan.learn_counts(dict(zip(roles, call.result(), strict=True)))

    async def aclose(self) -> None:
        """Stops the searches still running for recalls that gave up on them;
        the client is closed by its owner."""
        calls = list(self._late)
        for call in calls:
            call.cancel()
        await asyncio.gather(*calls, return_exceptions=True)


def _superseded_share(
    answered: Mapping[str, Mapping[str, Any]], sent: Mapping[str, Mapping[str, Any]], current: str
) -> float:
    """The share of superseded documents (``current_key`` not ``current``)
    among the hits of the searches that filled their page: only there did
    they take a slot a current memory could have had."""
    full = [
        h["document"]
        for role, answer in answered.items()
        if (hits := answer.get("hits", ())) and len(hits) >= int(sent[role].get("per_page", 0) or 0) > 0
        for h in hits
    ]
    if not full:
        return 0.0
    return sum(1 for doc in full if doc.get("current_key") != current) / len(full)


async def _given(records: tuple[MemoryRecord, ...]) -> tuple[MemoryRecord, ...]:
    return records


def _group_of(client: TypesenseClient, alias: str, groups: int, tenant: str) -> tuple[TypesenseClient, str]:
    return client, group_alias(alias, tenant, groups)


def _vector_ranking(
    hits: Sequence[Mapping[str, Any]],
    query: SearchQuery,
    pending: Iterable[Mapping[str, Any]],
    min_similarity: float | None,
    candidates: int,
) -> list[str]:
    """The vector search's memory ids, nearest first, with the ``pending``
    documents (not in Typesense yet) placed by their own cosine similarity to
    the query, and none less similar than ``min_similarity``.

    Only vectors of the query's model count: a document whose embedding
    another model made is dropped from this list (checked on the hits, as
    the tiers are: the clause would match nearly every document), never
    compared. Its keyword matches stand. Typesense's ``vector_distance`` is
    the cosine distance, ``1 - similarity`` (``None``: no floor).
    """
    q = np.asarray(query.vector, dtype=np.float64)
    near: list[tuple[float, int, str]] = [
        (1.0 - float(h.get("vector_distance", 0.0)), -i, h["document"]["memory_id"])
        for i, h in enumerate(hits)
        if h["document"].get("model") == query.model
    ]
    near += [
        (float(np.dot(q, np.asarray(d["embedding"], dtype=np.float64))), -len(hits), d["memory_id"])
        for d in pending
        if d.get("model") == query.model and "embedding" in d
    ]
    near.sort(key=lambda n: (-n[0], -n[1], n[2]))
    floor = -1.0 if min_similarity is None else min_similarity
    return [memory_id for similarity, _, memory_id in near if similarity >= floor][:candidates]


def _searches(
    query: SearchQuery,
    ts: TypesenseSourceConfig,
    terms: Sequence[str],
    candidates: int,
    *,
    count: bool,
    bm25: Bm25Plan | None = None,
    vectors: str | None = None,
    extra_fields: str = "",
) -> list[tuple[str, dict[str, Any]]]:
    """The searches of one multi_search, in the order sent, each with its role.

    Keyword: a ``term:<term>`` search per term, each document then scored by
    the summed idf of the terms that found it (:func:`idf_ranking`), and, if
    ``count``, a ``count`` search for the number of documents the filter
    allows (the idf's N); or, in the ``single`` keyword mode, one ``single``
    search for every term; or, in the ``bm25`` mode, ``bm25``'s searches
    (:meth:`Bm25Plan.searches`: the counts not cached and one candidate
    search). Vector: one ``vector`` (k-NN) search in collection ``vectors``
    (``None``: Typesense holds no vectors, and there is none), unless the
    config leaves it to a source that covers the vectors, or the recall's
    strategy allows keyword matching only (``query.matches``; a semantic one
    comes with no ``terms``). ``extra_fields`` is added to the vector
    search's ``include_fields`` (as to the others': the fields of the
    request's string filters, checked on the hits).
    """
    searches: list[tuple[str, dict[str, Any]]] = []
    if ts.keyword_mode == "single":
        if terms:
            searches.append(("single", _keyword_search(" ".join(terms), candidates, drop_tokens=candidates)))
    elif ts.keyword_mode == "bm25":
        if bm25 is not None:
            searches += bm25.searches()
    else:
        searches += [(f"term:{term}", _keyword_search(term, ts.term_hits)) for term in terms]
        if terms and count:
            searches.append(("count", {"q": "*", "per_page": 0}))
    vector_wanted = "vector" in query.matches and (ts.vector_search == "always" or not query.vectors_covered)
    if query.vector is not None and vectors is not None and vector_wanted:
        vector = vector_literal(query.vector)
        searches.append(
            (
                "vector",
                {
                    "collection": vectors,
                    "q": "*",
                    "vector_query": f"embedding:([{vector}], k:{candidates})",
                    "per_page": candidates,
                    # The model that made each document's embedding, checked on the hits.
                    "include_fields": f"{_HIT_FIELDS},model{extra_fields}",
                },
            )
        )
    return searches


register(
    SourceSpec(
        name=SOURCE,
        build=lambda deps: TypesenseSource(
            deps.typesense,
            deps.get_config().typesense.collection,
            deps.get_config,
            groups=deps.get_config().typesense.groups,
            route=deps.typesense_route,
            rewrite=deps.term_key_rewrite,
        ),
        defaults=source_defaults()[SOURCE],
        store="typesense",
        derived=True,
    )
)
