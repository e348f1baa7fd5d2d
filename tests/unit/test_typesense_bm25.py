"""The bm25 keyword mode's pure parts: terms, their selection, the scores."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.quality.bm25 import OkapiBM25
from indexers.base import MemoryRecord
from indexers.typesense.bm25 import (
    BM25_B,
    BM25_K1,
    Bm25Keywords,
    Bm25Plan,
    CorpusStats,
    bm25_score,
    bm25f_score,
    context_weights,
    select_terms,
)
from indexers.typesense.documents import (
    counts_reader,
    document_terms,
    keyed_terms,
    record_document,
    stem_key,
    term_entries,
    term_key,
)
from indexers.typesense.keywords import bm25_terms, idf, keyword_terms, normalised_text, stems, term_count, text_terms

TRICKY = [
    "Don't stop—the e-mail's at 10:30, café İstanbul ΟΔΟΣ snake_case x² ½",
    "tab\there\nnew  line \u00a0nbsp hy\u00adphen (Blue) [password]!",
    "plain ascii words, with punctuation; and 42 numbers.",
    "",
]


@pytest.mark.parametrize("text", TRICKY)
def test_text_terms_are_query_terms_word_by_word(text: str) -> None:
    """Documents and queries normalise words the same way (the filter is exact)."""
    by_word = ["".join(c for c in w if c.isalnum()).lower() for w in text.split()]
    assert text_terms(text) == [w for w in by_word if w]
    for word in text.split():
        assert keyword_terms(word) == text_terms(word)


@pytest.mark.parametrize("text", TRICKY)
def test_term_count_counts_whole_words(text: str) -> None:
    normalised = normalised_text(text)
    for term in {*text_terms(text), "a", "is", "stop", "ab"}:
        assert term_count(normalised, term) == normalised.split().count(term)


def test_term_count_skips_a_term_inside_a_word() -> None:
    text = normalised_text("Cat, cats and a bobcat: CAT! concat cat")
    assert term_count(text, "cat") == 3
    assert term_count(text, "cats") == 1


def test_document_terms_are_distinct_words_then_stems_and_lengths_count_all() -> None:
    # Without stems (typesense.stems false), the words only.
    assert document_terms("The cat saw the Cat.", "a dog's bone") == (
        ["cat", "saw", "dogs", "bone"],
        ";cat:2:0;saw:1:0;dogs:0:1;bone:0:1;",
        5,
        3,
    )
    assert document_terms("The cat saw the Cat.", "a dog's bone", stems=True) == (
        ["cat", "saw", "dogs", "bone", "~dog"],
        ";cat:2:0;saw:1:0;dogs:0:1;bone:0:1;~dog:0:1;",
        5,
        3,
    )
    assert document_terms("Is it?", None, stems=True) == ([], "", 2, 0)
    # Stopwords are known as words, before stemming ("having" is one, "haves"
    # not); a stem's count is of the other words of that stem.
    assert document_terms("having haves painted painting paint", None, stems=True) == (
        ["haves", "painted", "painting", "paint", "~have", "~paint"],
        ";haves:1:0;painted:1:0;painting:1:0;paint:1:0;~have:1:0;~paint:2:0;",
        5,
        0,
    )


def test_a_stems_term_counts_every_word_of_that_stem_and_the_exact_word_twice() -> None:
    """Words and stems are two fields of one BM25: "paint" finds "painted"
    through its stem, and the word itself through both."""
    assert stems(["researched", "researching", "research", "paints", "2023", "lgbtq"]) == [
        "research",
        "research",
        "research",
        "paint",
        "2023",
        "lgbtq",
    ]
    assert bm25_terms("What did Caroline research, and was she researching?") == [
        "caroline",
        "research",
        "researching",
        "~carolin",
        "~research",
    ]
    assert term_entries("~research") == ("~research", "research")
    assert term_entries("~univer") == ("~univer",)  # "univer" is not its own stem ("univ")
    assert term_entries("research") == ("research",)
    docs = [
        record_document(_record("exact", "I paint"), stems=True),
        record_document(_record("other", "two paintings"), stems=True),
        record_document(_record("none", "a sculpture"), stems=True),
    ]
    plan = Bm25Plan(
        "", term_key("t"), tuple(bm25_terms("paint")), 10, 1.0, "", CorpusStats(3, 2.0, None), {"paint": 1, "~paint": 2}
    )
    scores = plan.scores(docs)
    assert list(scores) == ["exact", "other", "none"] and scores["none"] == 0.0
    idf_word, idf_stem = idf(1, 3), idf(2, 3)
    norm = BM25_K1 * (1 - BM25_B + BM25_B * 2 / 2.0)
    one = (BM25_K1 + 1) / (1 + norm)
    assert scores["exact"] == pytest.approx(idf_word * one + idf_stem * one)
    assert scores["other"] == pytest.approx(idf_stem * one)


def test_stems_are_behind_a_key_of_their_own() -> None:
    key = term_key("tenant-a")
    assert stem_key(key) != key and len(stem_key(key)) == len(key) and stem_key(stem_key(key)) == key
    assert keyed_terms(key, ["paint", "~paint"]) == [key + "paint", stem_key(key) + "paint"]


def test_term_counts_reads_a_terms_content_and_context_counts() -> None:
    _, counts, _, _ = document_terms("cat 12 cat; cats", "12 12 x1 cat", stems=True)
    assert counts == ";cat:2:1;12:1:2;cats:1:0;x1:0:1;~cat:1:0;"
    every = counts_reader(["cat", "12", "cats", "x1", "1", "at", "dog", "~cat"])(counts)
    assert [every.get(t, (0, 0)) for t in ("cat", "12", "cats", "x1", "1", "at", "dog", "~cat")] == [
        (2, 1),
        (1, 2),
        (1, 0),
        (0, 1),
        (0, 0),
        (0, 0),
        (0, 0),
        (1, 0),
    ]
    assert counts_reader(["cat"])("") == {}
    read = counts_reader(["cat", "12", "at", "x1", "dog"])
    assert read(counts) == {"cat": (2, 1), "12": (1, 2), "x1": (0, 1)}
    assert read("") == {}
    assert counts_reader([])(counts) == {}


@settings(max_examples=200, deadline=None)
@given(
    texts=st.lists(
        st.tuples(
            st.text(alphabet="ab cs,.Ça1", max_size=40),
            st.none() | st.text(alphabet="ab cs,.Ça1", max_size=40),
        ),
        min_size=1,
        max_size=6,
    ),
    # Not "a": a stopword, in no document's counts. A query's terms are stopwords
    # only when all of them are, and then no document's ``terms`` has them.
    # "~ab": the stem field ("ab", "abs", "abss"...).
    query=st.lists(
        st.sampled_from(["b", "ab", "ba", "c", "1", "a1", "ça", "bs", "~ab", "~ba", "~b", "~c"]),
        min_size=1,
        max_size=4,
        unique=True,
    ),
    weight=st.sampled_from([0.0, 0.3, 1.0]),
)
def test_ranking_from_term_counts_is_ranking_from_the_texts(
    texts: list[tuple[str, str | None]], query: list[str], weight: float
) -> None:
    """What a document's stored counts give is what counting its texts gives."""
    stored, fetched = [], []
    for i, (content, context) in enumerate(texts):
        _, counts, length, context_length = document_terms(content, context, stems=True)
        lengths = {"length": length, "context_length": context_length}
        stored.append({"memory_id": str(i), "term_counts": counts, **lengths})
        fetched.append({"memory_id": str(i), "content": content, "context": context, **lengths})
    stats = CorpusStats(20, 5.0, 4.0)
    dfs = {t: 3 for t in query}
    assert _plan(query, dfs, stats=stats, weight=weight).ranking(stored) == _plan(
        query, dfs, stats=stats, weight=weight
    ).ranking(fetched)


def _record(memory_id: str, content: str) -> MemoryRecord:
    return MemoryRecord(
        id=memory_id,
        tenant="t",
        content=content,
        kind="fact",
        tier="rag",
        created_at=datetime(2024, 1, 1, tzinfo=UTC),
        confidence=1.0,
    )


def test_record_document_carries_terms_and_length() -> None:
    rec = MemoryRecord(
        id="m",
        tenant="t",
        content="Blue password",
        context="the password before",
        kind="fact",
        tier="rag",
        created_at=datetime(2024, 1, 1, tzinfo=UTC),
        confidence=1.0,
    )
    doc = record_document(rec)
    key = term_key("t")
    # "the", "before": stopwords, counted in the context's length. The bare
    # terms are not sent (nothing filters on them), only behind the term key.
    assert (doc["tenant_terms"], doc["term_counts"], doc["length"], doc["context_length"]) == (
        [key + "blue", key + "password"],
        ";blue:1:0;password:1:1;",
        2,
        3,
    )
    assert "terms" not in doc


def test_idf_is_lucenes_and_never_negative() -> None:
    assert idf(2, 100) == math.log(1 + 98.5 / 2.5)
    assert idf(100, 100) == math.log(1 + 0.5 / 100.5)
    # A cached N older than a df: N is taken to be at least df.
    assert idf(7, 5) == idf(7, 7)


def test_select_terms_takes_the_rarest_within_the_budget() -> None:
    dfs = {"common": 200, "rare": 3, "middle": 40, "gone": 0, "other": 40}
    terms = ["common", "rare", "middle", "gone", "other"]
    assert select_terms(terms, dfs, 250) == ["gone", "rare", "middle", "other"]  # 83; +200 is over
    assert select_terms(terms, dfs, 83) == ["gone", "rare", "middle", "other"]  # within, inclusive
    assert select_terms(terms, dfs, 82) == ["gone", "rare", "middle"]  # ties in query order
    assert select_terms(terms, dfs, 2) == ["gone", "rare"]  # the first with documents always
    assert select_terms(["common"], dfs, 10) == ["common"]
    assert select_terms([], dfs, 10) == []


def test_select_terms_takes_stems_only_after_the_words_and_within_the_budget() -> None:
    dfs = {"rare": 2, "common": 100, "~rare": 5, "~common": 120, "~gone": 0}
    terms = ["rare", "common", "~rare", "~common", "~gone"]
    assert select_terms(terms, dfs, 1000) == ["rare", "common", "~gone", "~rare", "~common"]
    # A word over the budget ends the words; a stem that fits still comes.
    assert select_terms(terms, dfs, 50) == ["rare", "~gone", "~rare"]
    # A stem never takes a word's place, however rare it is.
    assert select_terms(["common", "~gone"], dfs, 100) == ["common", "~gone"]
    assert select_terms(["common", "~rare"], dfs, 100) == ["common"]


DOCS = [
    "the cat sat on the mat",
    "a dog and a cat and a cat",
    "birds sing in the morning light over the quiet village green",
    "dog",
    "cat dog bird fish mouse horse sheep cow goat pig hen duck",
    "nothing relevant here at all",
]


@pytest.mark.parametrize("query", [["cat"], ["dog", "cat"], ["morning", "cat", "zebra"], ["dog"]])
def test_bm25_score_is_rank_bm25s_to_the_bit(query: list[str]) -> None:
    """Given OkapiBM25's idf and mean length, every document's score is its score."""
    tokens = [text_terms(d) for d in DOCS]
    okapi = OkapiBM25(tokens)
    avgdl = sum(len(t) for t in tokens) / len(tokens)
    idfs = {t: okapi.idf.get(t, 0.0) for t in query}
    expected = okapi.scores(query)
    for row, words in enumerate(tokens):
        tf = {t: words.count(t) for t in query}
        assert bm25_score(query, tf, len(words), idfs, avgdl) == expected[row]


def _plan(
    terms: list[str],
    dfs: dict[str, int],
    budget: int = 250,
    stats: CorpusStats | None = None,
    weight: float = 1.0,
    words: int = 0,
    lengths: str = "joint",
) -> Bm25Plan:
    return Bm25Plan(
        "current_key:=k",
        "k",
        tuple(terms),
        budget,
        weight,
        "content",
        stats,
        dict(dfs),
        context_words=words,
        field_lengths=lengths,
    )


def _scores_one_by_one(plan: Bm25Plan, docs: list[dict[str, object]]) -> dict[str, float]:
    """The scores as :func:`bm25_score` gives them, one candidate at a time
    (what ``Bm25Plan.scores`` computed before it worked over every
    candidate at once)."""
    w = plan.context_weight
    total = plan.stats.total if plan.stats is not None else len(docs)
    idfs = {t: idf(plan.dfs.get(t, 0), total) for t in plan.terms}
    read = counts_reader(plan.terms)
    tfs, lengths = [], []
    for doc in docs:
        if "term_counts" in doc:
            tfs.append({t: own + w * around for t, (own, around) in read(str(doc["term_counts"])).items()})
            lengths.append(int(doc["length"]) + w * int(doc["context_length"]))  # type: ignore[call-overload]
        else:
            content = normalised_text(str(doc.get("content", "")))
            context = normalised_text(str(doc.get("context") or "")) if w else ""
            tf: dict[str, float] = {t: term_count(content, t) for t in plan.terms}
            if context:
                for t in plan.terms:
                    tf[t] += w * term_count(context, t)
            tfs.append(tf)
            lengths.append(int(doc["length"]) + w * int(doc["context_length"]))  # type: ignore[call-overload]
    if plan.stats is not None and plan.stats.avgdl is not None:
        avgdl = plan.stats.avgdl + w * (plan.stats.avg_context or 0.0)
    else:
        avgdl = sum(lengths) / len(lengths)
    avgdl = avgdl or 1.0
    scores = [bm25_score(plan.terms, tf, length, idfs, avgdl) for tf, length in zip(tfs, lengths, strict=True)]
    order = sorted(range(len(docs)), key=lambda i: -scores[i])
    return {str(docs[i]["memory_id"]): scores[i] for i in order}


#: Candidates as (content, context, stored counts or texts), query terms and
#: corpus stats for the property tests of ``Bm25Plan.scores``.
_TEXTS = st.lists(
    st.tuples(
        st.text(alphabet="ab c,.1", max_size=60),
        st.none() | st.text(alphabet="ab cd", max_size=40),
        st.booleans(),
    ),
    min_size=1,
    max_size=12,
)
_QUERY = st.lists(st.sampled_from(["b", "ab", "ba", "c", "1", "cd", "zz"]), min_size=0, max_size=5, unique=True)
_STATS = st.none() | st.builds(CorpusStats, st.integers(0, 50), st.none() | st.floats(0.5, 30), st.floats(0, 10))


def _candidates(texts: list[tuple[str, str | None, bool]]) -> list[dict[str, object]]:
    """Typesense documents of ``texts``: with stored counts, or with only their texts."""
    docs: list[dict[str, object]] = []
    for i, (content, context, stored) in enumerate(texts):
        _, counts, length, context_length = document_terms(content, context)
        doc: dict[str, object] = {"memory_id": f"m{i}", "length": length, "context_length": context_length}
        doc.update({"term_counts": counts} if stored else {"content": content, "context": context})
        docs.append(doc)
    return docs


@settings(max_examples=300, deadline=None)
@given(
    texts=_TEXTS,
    query=_QUERY,
    weight=st.sampled_from([0.0, 0.3, 1.0]),
    stats=_STATS,
)
def test_scores_are_bm25_score_of_each_candidate_to_the_bit(
    texts: list[tuple[str, str | None, bool]], query: list[str], weight: float, stats: CorpusStats | None
) -> None:
    """Every candidate at once scores as :func:`bm25_score` scores each one
    (exactly, in the same order), with query terms in no document, none at
    all, documents with stored counts or only their texts, and no corpus
    stats."""
    docs = _candidates(texts)
    plan = _plan(query, {t: 2 for t in query[:2]}, stats=stats, weight=weight)
    scores = plan.scores(docs)
    expected = _scores_one_by_one(plan, docs)
    assert list(scores) == list(expected)
    assert scores == expected


@settings(max_examples=300, deadline=None)
@given(
    texts=_TEXTS,
    query=_QUERY,
    weight=st.sampled_from([0.0, 0.3, 1.0]),
    words=st.sampled_from([0, 3]),
    field_b=st.sampled_from([(BM25_B, BM25_B), (0.3, 1.0), (0.0, 0.5)]),
    stats=_STATS,
)
def test_each_field_lengths_score_as_bm25f_of_each_candidate(
    texts: list[tuple[str, str | None, bool]],
    query: list[str],
    weight: float,
    words: int,
    field_b: tuple[float, float],
    stats: CorpusStats | None,
) -> None:
    """``bm25FieldLengths: each``: every candidate scores as
    :func:`bm25f_score` with its content (weight 1) and its context (its
    context weight) as two fields, each against its own mean length (the
    filter's, else the candidates') and with its own ``b``, stored counts
    or texts alike."""
    docs = _candidates(texts)
    plan = _plan(query, {t: 2 for t in query[:2]}, stats=stats, weight=weight, words=words, lengths="each")
    plan.field_b = field_b
    total = stats.total if stats is not None else len(docs)
    idfs = {t: idf(plan.dfs.get(t, 0), total) for t in query}
    if stats is not None and stats.avgdl is not None:
        means = (stats.avgdl, stats.avg_context or 0.0)
    else:
        means = (
            sum(int(d["length"]) for d in docs) / len(docs),  # type: ignore[call-overload]
            sum(int(d["context_length"]) for d in docs) / len(docs),  # type: ignore[call-overload]
        )
    expected = {}
    for doc, w in zip(docs, context_weights(docs, weight, words), strict=True):
        own = {t: float(term_count(normalised_text(texts[int(str(doc["memory_id"])[1:])][0]), t)) for t in query}
        context = normalised_text(texts[int(str(doc["memory_id"])[1:])][1] or "")
        around = {t: float(term_count(context, t)) for t in query}
        fields = [
            (own, float(doc["length"]), means[0], 1.0, field_b[0]),  # type: ignore[arg-type]
            (around, float(doc["context_length"]), means[1], w, field_b[1]),  # type: ignore[arg-type]
        ]
        expected[doc["memory_id"]] = bm25f_score(query, fields, idfs)
    scores = plan.scores(docs)
    assert scores == expected
    assert list(scores) == sorted(expected, key=lambda m: -expected[m])


def test_bm25f_of_one_field_is_bm25() -> None:
    """One field of weight 1 scores as :func:`bm25_score` (to rounding)."""
    tf = {"heron": 2.0, "lake": 1.0}
    idfs = {"heron": 1.5, "lake": 0.4, "reed": 2.0}
    for length, mean in ((3, 10.0), (10, 10.0), (40, 7.5)):
        one = bm25f_score(["heron", "lake", "reed"], [(tf, length, mean, 1.0, BM25_B)], idfs)
        assert one == pytest.approx(bm25_score(["heron", "lake", "reed"], tf, length, idfs, mean), rel=1e-12)


def test_each_field_lengths_keep_a_long_context_from_diluting_a_short_content() -> None:
    """Two memories say "heron" once in four words; one has 200 words of
    context without it. As one text the long context ranks it second; each
    field on its own length, the context adds nothing and they score alike.
    A context that holds the term still counts, less when it is long."""
    filler = " ".join(f"w{i}" for i in range(200))
    docs = [
        {"memory_id": "long", "content": "i saw a heron", "length": 4, "context": filler, "context_length": 200},
        {"memory_id": "short", "content": "a heron flew by", "length": 4, "context": "look", "context_length": 1},
    ]
    stats = CorpusStats(100, 5.0, 40.0)
    joint = _plan(["heron"], {"heron": 5}, stats=stats).scores(docs)
    assert list(joint) == ["short", "long"] and joint["short"] > joint["long"]
    each = _plan(["heron"], {"heron": 5}, stats=stats, lengths="each").scores(docs)
    assert each["long"] == each["short"] and list(each) == ["long", "short"]
    around = [
        {"memory_id": "brief", "content": "it flew", "length": 2, "context": "a heron", "context_length": 2},
        {
            "memory_id": "wordy",
            "content": "it flew",
            "length": 2,
            "context": "a heron " + filler,
            "context_length": 202,
        },
    ]
    ranked = _plan(["heron"], {"heron": 5}, stats=stats, lengths="each").scores(around)
    assert list(ranked) == ["brief", "wordy"] and ranked["wordy"] > 0


def test_a_warm_plan_sends_one_search_for_the_chosen_terms() -> None:
    plan = _plan(["common", "rare"], {"common": 300, "rare": 2}, stats=CorpusStats(1000, 10.0))
    assert plan.searches() == [
        (
            "bm25",
            {
                "q": "*",
                "filter_by": "current_key:=k && tenant_terms:=[`krare`]",
                "per_page": 250,
                "sort_by": "length:asc",
                "include_fields": "content",
            },
        )
    ]


@pytest.mark.parametrize("union", [1.0, 1.5])
def test_a_warm_plan_within_the_union_searches_every_term_then_the_chosen_ones_if_it_overflowed(
    union: float,
) -> None:
    # 8 + 5 documents over a budget of 10: more than the budget, less than 1.5 times it.
    plan = Bm25Plan(
        "current_key:=k", "k", ("common", "rare"), 10, 1.0, "content", CorpusStats(1000, 10.0), {"common": 8, "rare": 5}
    )
    plan.union = union
    (role, search), *more = plan.searches()
    assert role == "bm25" and not more
    every = "current_key:=k && tenant_terms:=[`krare`,`kcommon`]"  # rarest first
    assert search["filter_by"] == (every if union > 1 else "current_key:=k && tenant_terms:=[`krare`]")
    # Documents holding both terms count once: a page that held them all is the answer ...
    assert plan.learn({"bm25": {"found": 10}}) is None
    # ... and one that overflowed is searched again for the rarest terms within the budget.
    again = plan.learn({"bm25": {"found": 13}})
    if union > 1:
        assert again is not None and again[1]["filter_by"] == "current_key:=k && tenant_terms:=[`krare`]"
    else:
        assert again is None  # it was sent for those already


def test_while_the_rewrite_is_pending_every_filter_names_both_forms_of_a_term() -> None:
    plan = Bm25Plan(
        "current_key:=k", "k", ("common", "rare"), 10, 1.0, "content", None, {"common": 300}, legacy_key="kkkk"
    )
    filters = {role: search.get("filter_by") for role, search in plan.searches()}
    assert filters == {
        "bm25:stats": None,
        "bm25:df:rare": "current_key:=k && tenant_terms:=[`krare`,`kkkkrare`]",
        "bm25": "current_key:=k && tenant_terms:=[`kcommon`,`krare`,`kkkkcommon`,`kkkkrare`]",
    }
    again = plan.learn({"bm25:df:rare": {"found": 2}, "bm25": {"found": 302}})
    assert again is not None and again[1]["filter_by"] == "current_key:=k && tenant_terms:=[`krare`,`kkkkrare`]"
    # A pending document (read from Postgres, written in the new form) is matched by the new form only.
    assert plan.holds_sent({"tenant_terms": ["krare"]}) and not plan.holds_sent({"tenant_terms": ["kkkkrare"]})


def test_a_cold_plan_counts_and_searches_every_term_then_retries_if_it_overflowed() -> None:
    plan = _plan(["common", "rare"], {"common": 300}, budget=10)
    roles = [role for role, _ in plan.searches()]
    assert roles == ["bm25:stats", "bm25:df:rare", "bm25"]
    assert plan.sent == ["common", "rare"]
    answers = {
        "bm25:stats": {
            "found": 1000,
            "facet_counts": [
                {"field_name": "length", "stats": {"avg": 12.5, "total_values": 990}},
                {"field_name": "context_length", "stats": {"total_values": 0}},
            ],
        },
        "bm25:df:rare": {"found": 2},
        "bm25": {"found": 301},
    }
    again = plan.learn(answers)
    assert again is not None and again[1]["filter_by"] == "current_key:=k && tenant_terms:=[`krare`]"
    assert plan.stats == CorpusStats(1000, 12.5, None) and plan.dfs == {"common": 300, "rare": 2}
    # A page that held every match is enough.
    plan = _plan(["common", "rare"], {}, budget=10)
    plan.searches()
    assert plan.learn({**answers, "bm25:df:common": {"found": 8}, "bm25": {"found": 10}}) is None


@pytest.mark.parametrize(("ttl", "kept"), [(0.0, False), (60.0, True), (None, True)])
def test_counts_learnt_are_kept_for_the_plans_ttl(ttl: float | None, kept: bool) -> None:
    """``sources.typesense.countTtlMs`` reaches the caches: 0 counts again at
    every recall; ``None`` keeps the caches' own time."""
    keywords = Bm25Keywords()
    plan = keywords.plan("current_key:=k", "k", ["rare"], 10, 1.0, "content", ttl)
    assert [role for role, _ in plan.searches()] == ["bm25:stats", "bm25:df:rare", "bm25"]
    plan.learn({"bm25:stats": {"found": 5, "facet_counts": []}, "bm25:df:rare": {"found": 2}, "bm25": {"found": 2}})
    warm = keywords.plan("current_key:=k", "k", ["rare"], 10, 1.0, "content", ttl)
    if kept:
        assert warm.dfs == {"rare": 2} and warm.stats == CorpusStats(5, None, None)
        assert [role for role, _ in warm.searches()] == ["bm25"]
    else:
        assert warm.dfs == {} and warm.stats is None


def test_a_document_frequency_is_reused_past_its_ttl_while_the_document_count_stays_within_the_drift() -> None:
    """``sources.typesense.countDrift``: past ``countTtlMs`` a term's count is
    reused while the filter's document count, counted again, moved at most
    that fraction since the term was counted; not with no current count, and
    never with a drift of 0 or a ``countTtlMs`` of 0."""
    learnt = {"bm25:stats": {"found": 1000, "facet_counts": []}, "bm25:df:rare": {"found": 2}, "bm25": {"found": 2}}

    def plan(keywords: Bm25Keywords, ttl: float, drift: float) -> Bm25Plan:
        return keywords.plan("current_key:=k", "k", ["rare"], 10, 1.0, "content", ttl, drift=drift)

    keywords = Bm25Keywords()
    first = plan(keywords, 0.001, 0.01)
    first.searches()
    first.learn(learnt)
    time.sleep(0.01)  # the count's ttl is over, and so is the document count's
    keywords.last_stats = type(keywords.last_stats)(0.0, 8)  # and no last count stands in
    assert plan(keywords, 0.001, 0.01).dfs == {}
    for total, kept in [(1010, True), (990, True), (1011, False), (989, False)]:
        keywords.stats.put("current_key:=k", CorpusStats(total, None), 60)
        warm = plan(keywords, 0.001, 0.01)
        assert (warm.dfs == {"rare": 2}) is kept, total
        assert [role for role, _ in warm.searches()] == (["bm25"] if kept else ["bm25:df:rare", "bm25"])
    keywords.stats.put("current_key:=k", CorpusStats(1000, None), 60)
    assert plan(keywords, 0.001, 0.0).dfs == {}
    # countTtlMs 0 counts again at every recall, whatever the drift.
    keywords = Bm25Keywords()
    first = plan(keywords, 0.0, 0.01)
    first.searches()
    first.learn(learnt)
    keywords.stats.put("current_key:=k", CorpusStats(1000, None), 60)
    assert plan(keywords, 0.0, 0.01).dfs == {}


def test_plan_ranking_is_bm25_over_every_query_term() -> None:
    """A document matching a left-out common term still gets its share; rare
    terms, repeats and short documents count as BM25 says."""
    stats = CorpusStats(100, 4.0)
    plan = _plan(["rare", "common"], {"rare": 2, "common": 10}, stats=stats)
    docs = [
        {"memory_id": "common-only", "content": "common common here", "length": 3},
        {"memory_id": "rare-long", "content": "rare and many other words in it", "length": 7, "context": "more"},
        {"memory_id": "rare-short", "content": "rare", "length": 1},
        {"memory_id": "both", "content": "rare common", "length": 2},
    ]
    # By hand: idf rare 3.70, common 2.26; both 7.69, rare-short 5.59,
    # common-only (twice in 3 terms) 3.52, rare-long (once in 8) 2.55.
    assert plan.ranking(docs) == ["both", "rare-short", "common-only", "rare-long"]
    idfs = {"rare": idf(2, 100), "common": idf(10, 100)}
    by_hand = idfs["common"] * 2 * 2.5 / (2 + 1.5 * (0.25 + 0.75 * 3 / 4))
    assert bm25_score(["rare", "common"], {"common": 2}, 3, idfs, 4.0) == pytest.approx(by_hand, rel=1e-15)


def test_the_context_counts_its_weight_in_tf_and_length() -> None:
    """BM25F with two fields: tf = tf(content) + w·tf(context), the same for
    the length and its mean."""
    stats = CorpusStats(50, 3.0, 9.0)
    docs = [
        {"memory_id": "said", "content": "the heron flew", "length": 3, "context": "x y z", "context_length": 3},
        {
            "memory_id": "around",
            "content": "it flew",
            "length": 2,
            "context": "a heron heron there",
            "context_length": 4,
        },
    ]
    idfs = {"heron": idf(5, 50)}
    for weight in (0.0, 0.3, 1.0):
        plan = _plan(["heron"], {"heron": 5}, stats=stats, weight=weight)
        avgdl = 3.0 + weight * 9.0
        said = bm25_score(["heron"], {"heron": 1}, 3 + weight * 3, idfs, avgdl)
        around = bm25_score(["heron"], {"heron": 2 * weight}, 2 + weight * 4, idfs, avgdl)
        assert plan.ranking(docs) == (["said", "around"] if said >= around else ["around", "said"])
    # Full weight: twice in a short context beats once in the content.
    assert _plan(["heron"], {"heron": 5}, stats=stats, weight=1.0).ranking(docs) == ["around", "said"]
    assert _plan(["heron"], {"heron": 5}, stats=stats, weight=0.3).ranking(docs) == ["said", "around"]


def test_a_long_memory_counts_its_context_less() -> None:
    """With ``bm25ContextWords`` n, a memory of more than n words counts its
    context at weight × n / length, in tf and length; a shorter one at the
    weight; the mean length stays the one at the weight."""
    stats = CorpusStats(50, 3.0, 9.0)
    long_content = "it flew over " + " ".join(f"w{i}" for i in range(17))  # 20 words
    docs = [
        {"memory_id": "long", "content": long_content, "length": 20, "context": "heron " * 4, "context_length": 4},
        {"memory_id": "short", "content": "it flew", "length": 2, "context": "a heron there", "context_length": 3},
    ]
    assert context_weights(docs, 1.0, 0) == [1.0, 1.0]
    assert context_weights(docs, 1.0, 5) == [0.25, 1.0]
    assert context_weights(docs, 0.5, 5) == [0.125, 0.5]
    assert context_weights(docs, 0.0, 5) == [0.0, 0.0]
    assert context_weights([{"content": "one two three four"}], 1.0, 2) == [0.5]  # no stored length
    idfs = {"heron": idf(5, 50)}
    avgdl = 3.0 + 9.0
    for words, long_w in ((0, 1.0), (5, 0.25)):
        scores = _plan(["heron"], {"heron": 5}, stats=stats, words=words).scores(docs)
        assert scores["long"] == bm25_score(["heron"], {"heron": 4 * long_w}, 20 + long_w * 4, idfs, avgdl)
        assert scores["short"] == bm25_score(["heron"], {"heron": 1.0}, 2 + 3, idfs, avgdl)
    # Full weight: four times in the context lifts the long memory above the short one;
    # at 5 words its context counts a quarter, and the short memory comes first.
    assert _plan(["heron"], {"heron": 5}, stats=stats).ranking(docs) == ["long", "short"]
    assert _plan(["heron"], {"heron": 5}, stats=stats, words=5).ranking(docs) == ["short", "long"]


def test_a_context_counts_for_at_most_the_cap() -> None:
    """With ``bm25ContextCap`` n, a context longer than n words counts at
    n / its length (after ``bm25ContextWords``), in tf and length, and the
    mean length takes a mean context of at most n: a short turn between
    two long replies is no longer buried by their length."""
    filler = " ".join(f"w{i}" for i in range(400))
    docs = [
        {"memory_id": "buried", "content": "i saw a heron", "length": 4, "context": filler, "context_length": 400},
        {
            "memory_id": "reply",
            "content": "a heron " + " ".join(filler.split()[:148]),
            "length": 150,
            "context": "ok",
            "context_length": 1,
        },
    ]
    assert context_weights(docs, 1.0, 0, 0) == [1.0, 1.0]
    assert context_weights(docs, 1.0, 0, 80) == [0.2, 1.0]
    assert context_weights(docs, 0.5, 0, 80) == [0.2, 0.5]
    assert context_weights(docs, 1.0, 40, 80) == [0.2, 40 / 150]
    assert context_weights([{"content": "x", "context": "a b c d"}], 1.0, 0, 2) == [0.5]  # no stored length
    stats = CorpusStats(50, 10.0, 300.0)
    idfs = {"heron": idf(5, 50)}
    capped = _plan(["heron"], {"heron": 5}, stats=stats)
    capped.context_cap = 80
    scores = capped.scores(docs)
    assert scores["buried"] == bm25_score(["heron"], {"heron": 1.0}, 4 + 0.2 * 400, idfs, 10.0 + 80)
    assert scores["reply"] == bm25_score(["heron"], {"heron": 1.0}, 150 + 1, idfs, 10.0 + 80)
    assert list(scores) == ["buried", "reply"]
    # Uncapped, the 400 words around the short turn put it below the reply.
    assert list(_plan(["heron"], {"heron": 5}, stats=stats).scores(docs)) == ["reply", "buried"]


def test_expired_stats_stand_in_while_one_plan_at_a_time_counts_them_again() -> None:
    """Past ``countTtlMs`` the filter's last stats (and, by the drift, the
    terms' counts) serve every plan; the first plan sends the stats search,
    the others send only their candidates until it answers or fails."""
    learnt = {
        "bm25:stats": {
            "found": 1000,
            "facet_counts": [{"field_name": "length", "stats": {"avg": 4.0, "total_values": 9}}],
        },
        "bm25:df:rare": {"found": 2},
        "bm25": {"found": 2},
    }
    keywords = Bm25Keywords()

    def plan() -> Bm25Plan:
        return keywords.plan("current_key:=k", "k", ["rare"], 10, 1.0, "content", 0.001, drift=0.01)

    first = plan()
    first.searches()
    first.learn(learnt)
    time.sleep(0.01)  # every count's ttl is over
    counting, waiting = plan(), plan()
    assert counting.recount and counting.counting and not waiting.recount and not waiting.counting
    assert counting.stats == waiting.stats == CorpusStats(1000, 4.0, None)
    assert counting.dfs == waiting.dfs == {"rare": 2}
    assert [role for role, _ in counting.searches()] == ["bm25:stats", "bm25"]
    assert [role for role, _ in waiting.searches()] == ["bm25"]
    # A failed count lets the next plan count.
    counting.unanswered()
    again = plan()
    assert again.recount
    # An answer is fresh again for everyone.
    again.searches()
    again.learn({**learnt, "bm25:stats": {"found": 1004, "facet_counts": []}})
    fresh = plan()
    assert not fresh.recount and fresh.stats == CorpusStats(1004, None, None)
    assert [role for role, _ in fresh.searches()] == ["bm25"]
    # countTtlMs 0 counts at every recall: nothing stands in.
    time.sleep(0.01)
    zero = keywords.plan("current_key:=k", "k", ["rare"], 10, 1.0, "content", 0.0, drift=0.01)
    assert zero.stats is None and not zero.recount
