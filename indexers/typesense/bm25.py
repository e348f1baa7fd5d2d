"""The ``bm25`` keyword mode: Okapi BM25 over candidates Typesense filters out.

Typesense 0.24.1 has no idf, term frequency or length normalisation, and a
multi-word search cannot find a document that matches only a middle word.
So every document carries its distinct terms (``tenant_terms``, a ``string[]``) and
the lengths of its content and context (``length``, ``context_length``;
:func:`~.documents.document_terms`), and a recall:

1. filters the documents holding any of the query's chosen terms
   (``filter_by: <narrow> && tenant_terms:=[t1,t2,...]``, each term behind
   a prefix of the tenant's key: :func:`~.documents.tenant_terms`; no text
   search at all);
2. scores those candidates in Braid by BM25 over *every* query term (its
   words, and their stems as terms of a field of their own:
   :func:`~.keywords.bm25_terms`), the context counting ``bm25ContextWeight``
   of the content (BM25F with two fields, by ``bm25FieldLengths`` as one
   text of one length or each normalised by its own): tf read from the candidate's stored ``term_counts`` (fetched
   with it; the texts themselves are not), its stored lengths, idf from each term's document frequency
   behind the recall's filter, the mean lengths from a facet over them
   behind the same filter (Typesense's facet stats give exact means);
3. returns them best first.

Document frequencies, the filter's document count and the mean length are
counts, cached per filter for :data:`~.keywords.COUNT_TTL_S` seconds, so with
warm caches a recall sends one keyword search. Once the filter's counts
expire, one recall at a time counts them again while the others go on with
the expired ones (:meth:`Bm25Keywords.plan`), and counts sent for are
learnt even when the recall that sent them gave up waiting
(:meth:`~.source.TypesenseSource.search_first`): under load a recall past its
deadline must not leave the next one just as cold. When the OR of all the terms
would match more documents than a page holds, the most common terms are left
out of the filter (rarest first, while their summed frequencies stay within
``sources.typesense.bm25Candidates``): a document matching only common terms
scores low anyway. A cold cache sends the counts with a first candidate
search for every term, and a second search only if that one overflowed.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .documents import counts_findall, keyed_terms, quoted_list, term_entries
from .keywords import COUNT_CACHE_SIZE, COUNT_TTL_S, STEM, TtlCache, idf, normalised_text, stems, term_count

__all__ = [
    "BM25_B",
    "BM25_K1",
    "CANDIDATES",
    "Bm25Keywords",
    "Bm25Plan",
    "CorpusStats",
    "bm25_score",
    "bm25f_score",
    "context_weights",
    "select_terms",
]

#: Okapi BM25's parameters (as rank_bm25 and the benchmarks' reference).
BM25_K1 = 1.5
BM25_B = 0.75

#: The longest a term's document frequency is reused past the count TTL,
#: while the documents behind its filter stay within the drift (seconds), and
#: the longest a filter's counts stand in for themselves while one recall
#: counts them again.
COUNT_MAX_AGE_S = 3600.0

#: How long one recall's counting of a filter's stats keeps the others from
#: sending the same count (seconds): the count's answer, or its failure, ends
#: it sooner.
STATS_IN_FLIGHT_S = 30.0

#: The roles of the mode's searches in a multi_search.
STATS = "bm25:stats"
DF = "bm25:df:"
CANDIDATES = "bm25"


@dataclass(frozen=True)
class CorpusStats:
    """What idf and length normalisation need of the documents behind a
    filter: how many (``N``) and their mean ``length`` and
    ``context_length`` (``None``: no document has one, written before the
    fields existed)."""

    total: int
    avgdl: float | None
    avg_context: float | None = None


def select_terms(terms: Sequence[str], dfs: Mapping[str, int], budget: int) -> list[str]:
    """The terms a candidate search filters on: the words rarest first (ties
    in query order), then the stems (:data:`~.keywords.STEM`) rarest first,
    while their summed document frequencies stay within ``budget``; the
    rarest word always. A term no document had is kept (it costs nothing,
    and a memory written since the count was cached is then found). Stems
    come last so that they only add candidates: a page that overflows keeps
    its shortest documents, and a stem filling it would push out long
    documents holding the words."""
    chosen: list[str] = []
    summed = 0
    for of_stems in (False, True):
        for term in sorted((t for t in terms if t.startswith(STEM) == of_stems), key=lambda t: dfs[t]):
            if summed and summed + dfs[term] > budget:
                break
            chosen.append(term)
            summed += dfs[term]
    return chosen


def bm25_score(
    terms: Sequence[str],
    tf: Mapping[str, float],
    length: float,
    idfs: Mapping[str, float],
    avgdl: float,
    k1: float = BM25_K1,
    b: float = BM25_B,
) -> float:
    """Okapi BM25 of one document: the sum over ``terms`` of
    ``idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / avgdl))``,
    in rank_bm25's order of operations."""
    norm = k1 * (1 - b + b * length / avgdl)
    score = 0.0
    for term in terms:
        f = tf.get(term, 0)
        if f:  # an absent term adds exactly 0.0
            score += idfs[term] * (f * (k1 + 1) / (f + norm))
    return score


def bm25f_score(
    terms: Sequence[str],
    fields: Sequence[tuple[Mapping[str, float], float, float, float, float]],
    idfs: Mapping[str, float],
    k1: float = BM25_K1,
) -> float:
    """BM25F of one document whose ``fields`` are ``(tf, length, mean
    length, weight, b)`` each: the sum over ``terms`` of ``idf * t * (k1 +
    1) / (t + k1)``, where ``t`` sums each field's ``weight * tf / (1 - b +
    b * length / mean)`` (Robertson and Zaragoza's simple BM25F). With one
    field of weight 1 it is :func:`bm25_score`'s value."""
    score = 0.0
    for term in terms:
        t = 0.0
        for tf, length, mean, weight, b in fields:
            f = tf.get(term, 0)
            if f:  # an empty field (a norm of 0 at b 1) holds no term
                t += weight * (f / (1 - b + b * length / (mean or 1.0)))
        if t:
            score += idfs[term] * (t * (k1 + 1) / (t + k1))
    return score


def context_weights(docs: Sequence[Mapping[str, Any]], weight: float, words: int, cap: int = 0) -> list[float]:
    """What the context of each of ``docs`` counts against its content:
    ``weight``, or with ``words`` > 0, ``weight * words / length`` for a
    memory whose content is longer than ``words`` (its ``length``, else its
    content's words); with ``cap`` > 0, at most ``cap / context_length``
    (its ``context_length``, else its context's words), so a context counts
    for at most ``cap`` words. Neighbouring turns stand in for what a short
    memory leaves unsaid ("Sure, here it is!"); a long one says its own, and
    a long context must not bury a short memory's own words."""
    if not weight or (not words and not cap):
        return [weight] * len(docs)
    out = []
    for doc in docs:
        w = weight
        if words:
            length = doc["length"] if "length" in doc else len(normalised_text(doc.get("content", "")).split())
            if length > words:
                w = weight * words / length
        if cap:
            around = (
                doc["context_length"]
                if "context_length" in doc
                else len(normalised_text(doc.get("context") or "").split())
            )
            if around * w > cap:
                w = cap / around
        out.append(w)
    return out


def _mean(facet: Mapping[str, Any]) -> float | None:
    """The mean of a numeric facet's values, ``None`` if it has none."""
    stats = facet.get("stats", {})
    return float(stats["avg"]) if stats.get("total_values") and "avg" in stats else None


def _entries(terms: Sequence[str]) -> list[str]:
    """The ``tenant_terms`` entries of ``terms`` (:func:`~.documents.term_entries`), distinct."""
    return list(dict.fromkeys(e for t in terms for e in term_entries(t)))


def _filter(narrow: str, key: str, terms: Sequence[str], legacy_key: str | None = None) -> str:
    entries = _entries(terms)
    keyed = keyed_terms(key, entries)
    if legacy_key is not None:
        # Written before migration 26, long before typesense.stems: words only.
        keyed += keyed_terms(legacy_key, [e for e in entries if not e.startswith(STEM)])
    terms_clause = f"tenant_terms:={quoted_list(keyed)}"
    return f"{narrow} && {terms_clause}" if narrow else terms_clause


@dataclass
class Bm25Plan:
    """One recall's keyword searches: what the caches already knew, what was
    sent, and what the answers taught."""

    filter_by: str
    #: The tenant's term key (:func:`~.documents.term_key`), before each term filtered on.
    key: str
    terms: tuple[str, ...]
    budget: int
    context_weight: float
    include_fields: str
    stats: CorpusStats | None
    dfs: dict[str, int]
    #: How long the counts learnt are kept, in seconds (``None``: the caches' own).
    ttl: float | None = None
    #: The terms of the candidate search sent last (``None``: none sent).
    sent: list[str] | None = None
    found: int = 0
    #: The tenant's whole key (:func:`~.documents.tenant_key`), before each term
    #: too in the filters: what ``tenant_terms`` of a document written before
    #: migration 26 holds (``None``: that form is not asked for).
    legacy_key: str | None = None
    #: What the caches file the counts under (``None``: ``filter_by``): a
    #: filter names no tenant in a collection of one tenant's own.
    scope: str | None = None
    #: A document frequency learnt is reused past ``ttl`` (for up to
    #: :data:`COUNT_MAX_AGE_S`) while the number of documents behind the
    #: filter is within this fraction of what it was when the frequency was
    #: counted (0: ``ttl`` only).
    drift: float = 0.0
    #: :attr:`stats` are the filter's expired counts, and this plan counts them
    #: again (one plan at a time does: :meth:`Bm25Keywords.plan`).
    recount: bool = False
    #: The candidate search takes every term while their summed document
    #: frequencies are within this many times :attr:`budget` (documents holding
    #: several terms count once in the answer: the sum overstates it); a page
    #: that overflows then is searched again for the terms :func:`select_terms`
    #: chooses (:meth:`learn`). 1: those terms at once.
    union: float = 1.0
    #: A memory whose content is longer than this many words counts its
    #: context at :attr:`context_weight` × ``context_words / length``
    #: (:func:`context_weights`). 0: every context at :attr:`context_weight`.
    context_words: int = 0
    #: A context counts for at most this many words: a longer one at
    #: ``context_cap / context_length`` (:func:`context_weights`), and the mean
    #: length takes the mean context at most this long. 0: no cap.
    context_cap: int = 0
    #: ``joint``: content and context are one text of one length against one
    #: mean (:func:`bm25_score`). ``each``: each is normalised by its own
    #: length against its own mean before they are weighted and summed
    #: (:func:`bm25f_score`), so a long context no longer dilutes a short
    #: content's matches.
    field_lengths: str = "joint"
    #: With :attr:`field_lengths` ``each``: BM25's ``b`` (how much length
    #: counts) of the content and of the context.
    field_b: tuple[float, float] = (BM25_B, BM25_B)
    _cache: Bm25Keywords | None = field(default=None, repr=False)

    @property
    def cache_key(self) -> str:
        """The counts' key in the caches: :attr:`scope`, else the filter."""
        return self.filter_by if self.scope is None else self.scope

    def _candidates(self, terms: Sequence[str]) -> tuple[str, dict[str, Any]]:
        self.sent = list(terms)
        return (
            CANDIDATES,
            {
                "q": "*",
                "filter_by": _filter(self.filter_by, self.key, terms, self.legacy_key),
                "per_page": self.budget,
                # Should the page overflow, the shortest documents (BM25's best
                # for one occurrence) come first.
                "sort_by": "length:asc",
                "include_fields": self.include_fields,
            },
        )

    def searches(self) -> list[tuple[str, dict[str, Any]]]:
        """The first multi_search's keyword searches: the counts the caches
        lack and a candidate search (for the chosen terms when every document
        frequency is known, else for all of them)."""
        searches: list[tuple[str, dict[str, Any]]] = []
        if self.stats is None or self.recount:
            facets = {"facet_by": "length,context_length", "max_facet_values": 1}
            searches.append((STATS, {"q": "*", "per_page": 0, **facets}))
        missing = [t for t in self.terms if t not in self.dfs]
        searches += [
            (DF + t, {"q": "*", "per_page": 0, "filter_by": _filter(self.filter_by, self.key, [t], self.legacy_key)})
            for t in missing
        ]
        if missing:
            chosen = list(self.terms)
        else:
            # Within the union every term goes, in select_terms' order.
            every = sum(self.dfs[t] for t in self.terms) <= self.budget * self.union
            chosen = select_terms(self.terms, self.dfs, sys.maxsize if every else self.budget)
        searches.append(self._candidates(chosen))
        return searches

    @property
    def counting(self) -> bool:
        """Whether :meth:`searches` count anything (the stats or a term's
        document frequency) that the caches would keep."""
        return self.stats is None or self.recount or any(t not in self.dfs for t in self.terms)

    def learn_counts(self, results: Mapping[str, Mapping[str, Any]]) -> None:
        """Read the counts from ``results`` (by role) into the plan and the
        caches (again with the same answers: the same counts)."""
        answer = results.get(STATS)
        if answer is not None:
            means = {f["field_name"]: _mean(f) for f in answer.get("facet_counts", [])}
            self.stats = CorpusStats(int(answer.get("found", 0)), means.get("length"), means.get("context_length"))
            self.recount = False
            if self._cache is not None:
                self._cache.put_stats(self.cache_key, self.stats, self.ttl)
        for term in self.terms:
            answer = results.get(DF + term)
            if answer is not None:
                self.dfs[term] = int(answer.get("found", 0))
                if self._cache is not None:
                    self._cache.put_df(self.cache_key, term, self.dfs[term], self.stats, self.ttl, self.drift)

    def unanswered(self) -> None:
        """The searches of :meth:`searches` failed: another plan may count
        the stats again at once."""
        if self.recount and self._cache is not None:
            self._cache.counting.put(self.cache_key, False, 0.0)

    def learn(self, results: Mapping[str, Mapping[str, Any]]) -> tuple[str, dict[str, Any]] | None:
        """Read the counts from ``results`` (by role) into the plan and the
        caches (:meth:`learn_counts`); returns the candidate search to send
        again if the first one overflowed its page and fewer terms would not."""
        self.learn_counts(results)
        answer = results.get(CANDIDATES)
        self.found = 0 if answer is None else int(answer.get("found", 0))
        if self.sent is None or self.found <= self.budget:
            return None
        chosen = select_terms(self.terms, self.dfs, self.budget)
        return None if chosen == self.sent else self._candidates(chosen)

    def ranking(self, docs: Sequence[Mapping[str, Any]], floor: float = 0.0) -> list[str]:
        """The candidates' memory ids by BM25 over every query term, best
        first (ties keep Typesense's order: shorter first), without those
        scoring below ``floor`` times the best score (0: none left out)."""
        scored = self.scores(docs)
        best = max(scored.values(), default=0.0)
        return [m for m, score in scored.items() if score >= floor * best]

    def holds_sent(self, doc: Mapping[str, Any]) -> bool:
        """Whether the last candidate search (its ``tenant_terms:=[...]`` filter)
        would have found ``doc``: it holds one of the terms it was sent for."""
        return self.sent is not None and not set(keyed_terms(self.key, _entries(self.sent))).isdisjoint(
            doc.get("tenant_terms", ())
        )

    def scores(self, docs: Sequence[Mapping[str, Any]]) -> dict[str, float]:
        """The candidates' memory ids and BM25 scores over every query term,
        best first (ties keep the order of ``docs``): each score is
        :func:`bm25_score`'s to the bit, computed a term at a time over
        every candidate at once."""
        if not docs:
            return {}
        terms = self.terms
        total = self.stats.total if self.stats is not None else len(docs)
        # A term's row in tf (the terms are distinct: bm25_terms), and the
        # rows each term_counts entry counts in (a stem's term counts its
        # word's entry too: term_entries).
        row = {t: i for i, t in enumerate(terms)}
        feeds: dict[str, list[int]] = {}
        for t, i in row.items():
            for entry in term_entries(t):
                feeds.setdefault(entry, []).append(i)
        n = len(docs)
        own_lengths = np.empty(n)
        context_lengths = np.empty(n)
        weights = context_weights(docs, self.context_weight, self.context_words, self.context_cap)
        # The tf of each (term, candidate) the candidate has, in its content
        # and in its context: every other one is 0.
        rows: list[int] = []
        cols: list[int] = []
        own_values: list[float] = []
        context_values: list[float] = []
        findall = counts_findall(list(feeds))
        for i, doc in enumerate(docs):
            w = weights[i]
            counts = doc.get("term_counts")
            if counts is not None:
                if findall is not None:
                    for entry, own_tf, around_tf in findall(counts):
                        for j in feeds[entry]:
                            rows.append(j)
                            cols.append(i)
                            own_values.append(int(own_tf))
                            context_values.append(int(around_tf))
                own_lengths[i] = doc["length"]
                context_lengths[i] = doc["context_length"]
            else:
                # Written before documents had counts (migration 14 rewrites them):
                # counted in the texts fetched with it (a stem's term: every word of that stem).
                content = normalised_text(doc.get("content", ""))
                context = normalised_text(doc.get("context") or "") if w else ""
                stemmed = (
                    {t: " ".join(stems(t.split())) for t in (content, context)}
                    if any(t.startswith(STEM) for t in row)
                    else {}
                )
                for t, j in row.items():
                    stem = t.startswith(STEM)
                    word = t[len(STEM) :] if stem else t
                    said = term_count(stemmed[content] if stem else content, word)
                    heard = term_count(stemmed[context] if stem else context, word) if context else 0
                    if said or heard:
                        rows.append(j)
                        cols.append(i)
                        own_values.append(said)
                        context_values.append(heard)
                own_lengths[i] = doc["length"] if "length" in doc else len(content.split())
                context_lengths[i] = doc["context_length"] if "context_length" in doc else len(context.split())
        w_row = np.array(weights)
        own = np.zeros((len(terms), n))
        own[rows, cols] = own_values
        around = np.zeros((len(terms), n))
        around[rows, cols] = context_values
        # The filter's mean lengths; none known (no document behind the
        # filter had lengths): the candidates'.
        stats = self.stats
        avg_own = stats.avgdl if stats is not None else None
        avg_around = (stats.avg_context or 0.0) if stats is not None and avg_own is not None else None
        k1, b = BM25_K1, BM25_B
        if self.field_lengths == "each":
            # BM25F: each field's tf normalised by its own length against its
            # own mean, weighted, summed, then saturated once (bm25f_score).
            if avg_own is None or avg_around is None:
                avg_own, avg_around = sum(own_lengths.tolist()) / n, sum(context_lengths.tolist()) / n
            own_b, around_b = self.field_b
            own_norm = 1 - own_b + own_b * own_lengths / (avg_own or 1.0)
            around_norm = 1 - around_b + around_b * context_lengths / (avg_around or 1.0)
            # An empty field (length 0 at b 1: a norm of 0) holds no term.
            own_part = np.divide(own, own_norm, out=np.zeros_like(own), where=own != 0)
            around_part = np.divide(around, around_norm, out=np.zeros_like(around), where=around != 0)
            tf = own_part + w_row * around_part
            norm = np.full(n, k1)
        else:
            tf = own + w_row * around
            lengths = own_lengths + w_row * context_lengths
            if avg_own is not None and avg_around is not None:
                around_mean = self.context_weight * avg_around
                if self.context_cap:
                    around_mean = min(around_mean, self.context_cap)
                avgdl = avg_own + around_mean
            else:
                avgdl = sum(lengths.tolist()) / n
            avgdl = avgdl or 1.0
            norm = k1 * (1 - b + b * lengths / avgdl)
        # bm25_score's operations in its order, each over every candidate: a
        # term a candidate lacks adds idf * 0.0, which leaves its sum as it was.
        scores = np.zeros(n)
        for term in terms:
            f = tf[row[term]]
            scores += idf(self.dfs.get(term, 0), total) * (f * (k1 + 1) / (f + norm))
        order = np.argsort(-scores, kind="stable").tolist()
        ranked = scores.tolist()
        return {docs[i]["memory_id"]: ranked[i] for i in order}


class Bm25Keywords:
    """The mode's caches (per filter: the corpus stats; per filter and term:
    the document frequency), shared by the recalls of one source."""

    def __init__(self) -> None:
        self.stats: TtlCache[str, CorpusStats] = TtlCache(COUNT_TTL_S, COUNT_CACHE_SIZE)
        #: Per filter: its last stats, kept :data:`COUNT_MAX_AGE_S` to stand in
        #: for themselves while one plan counts them again.
        self.last_stats: TtlCache[str, CorpusStats] = TtlCache(COUNT_MAX_AGE_S, COUNT_CACHE_SIZE)
        #: Per filter: a plan is counting its stats again (true until its
        #: answer, its failure or :data:`STATS_IN_FLIGHT_S`).
        self.counting: TtlCache[str, bool] = TtlCache(STATS_IN_FLIGHT_S, COUNT_CACHE_SIZE)
        #: Per filter and term: the frequency, until when it is fresh (monotonic
        #: seconds), and the number of documents behind the filter then (``None``: unknown).
        self.dfs: TtlCache[tuple[str, str], tuple[int, float, int | None]] = TtlCache(COUNT_TTL_S, COUNT_CACHE_SIZE)

    def put_stats(self, scope: str, stats: CorpusStats, ttl: float | None) -> None:
        """Keep the stats of ``scope``: fresh for ``ttl`` seconds (``None``:
        the caches' own), then standing in while they are counted again
        (none with a ``ttl`` of 0: counted at every recall)."""
        self.stats.put(scope, stats, ttl)
        if ttl is None or ttl > 0:
            self.last_stats.put(scope, stats)
        self.counting.put(scope, False, 0.0)

    def put_df(
        self, scope: str, term: str, df: int, stats: CorpusStats | None, ttl: float | None, drift: float
    ) -> None:
        """Keep ``term``'s document frequency behind ``scope``: fresh for
        ``ttl`` seconds (``None``: the caches' own), then, with ``drift``,
        reused while the filter's document count stays within it
        (:meth:`df`) for up to :data:`COUNT_MAX_AGE_S`."""
        fresh = self.dfs.ttl if ttl is None else ttl
        kept = max(fresh, COUNT_MAX_AGE_S) if drift > 0 and fresh > 0 else fresh
        value = (df, time.monotonic() + fresh, None if stats is None else stats.total)
        self.dfs.put((scope, term), value, kept)

    def df(self, scope: str, term: str, stats: CorpusStats | None, drift: float) -> int | None:
        """``term``'s document frequency behind ``scope`` if it is still
        fresh, or if ``stats`` (the filter's current counts) show at most
        ``drift`` of change in the number of documents since it was counted;
        else ``None``. A count that moved that little moves each idf by about
        as little, and the candidates are found by the filter, never by the
        counts."""
        entry = self.dfs.get((scope, term))
        if entry is None:
            return None
        df, fresh_until, total = entry
        if time.monotonic() < fresh_until:
            return df
        if drift > 0 and stats is not None and total is not None and abs(stats.total - total) <= drift * total:
            return df
        return None

    def plan(
        self,
        filter_by: str,
        key: str,
        terms: Sequence[str],
        budget: int,
        context_weight: float,
        include_fields: str,
        ttl: float | None = None,
        legacy_key: str | None = None,
        scope: str | None = None,
        drift: float = 0.0,
        union: float = 1.0,
        context_words: int = 0,
        field_lengths: str = "joint",
        field_b: tuple[float, float] = (BM25_B, BM25_B),
        context_cap: int = 0,
    ) -> Bm25Plan:
        """A recall's plan, with what the caches know of ``filter_by`` (filed
        under ``scope`` instead if given: :attr:`Bm25Plan.scope`), for the
        tenant of term key ``key`` (:func:`~.documents.term_key`); the counts it learns are
        kept ``ttl`` seconds (``None``: the caches' own); ``legacy_key``: the
        filters name each term behind it too (:attr:`Bm25Plan.legacy_key`);
        ``drift``: :attr:`Bm25Plan.drift`; ``union``: :attr:`Bm25Plan.union`;
        ``context_words``: :attr:`Bm25Plan.context_words`; ``field_lengths``,
        ``field_b``: :attr:`Bm25Plan.field_lengths`, :attr:`Bm25Plan.field_b`;
        ``context_cap``: :attr:`Bm25Plan.context_cap`."""
        cache_key = filter_by if scope is None else scope
        stats = self.stats.get(cache_key)
        recount = False
        if stats is None and ttl != 0:
            # Expired: the last counts stand in (for idf, the mean lengths and
            # the drift: they are at most one count old) while this plan
            # counts them again, unless another one is already at it.
            stats = self.last_stats.get(cache_key)
            if stats is not None and not self.counting.get(cache_key):
                recount = True
                self.counting.put(cache_key, True)
        dfs = {t: df for t in terms if (df := self.df(cache_key, t, stats, drift)) is not None}
        return Bm25Plan(
            filter_by,
            key,
            tuple(terms),
            budget,
            context_weight,
            include_fields,
            stats,
            dfs,
            ttl,
            legacy_key=legacy_key,
            scope=scope,
            drift=drift,
            recount=recount,
            union=union,
            context_words=context_words,
            field_lengths=field_lengths,
            field_b=field_b,
            context_cap=context_cap,
            _cache=self,
        )
