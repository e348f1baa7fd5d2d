"""The sources' relevance floors and the unindexed memories' places, with exact values."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from config import ConfigError, parse_config
from indexers.base import Hit, MemoryRecord, SearchQuery
from indexers.graph import above_share
from indexers.pgvector import similarity_floor
from indexers.typesense.bm25 import Bm25Plan, CorpusStats
from indexers.typesense.documents import combined_document
from indexers.typesense.keywords import idf
from indexers.typesense.source import _vector_ranking

T0 = datetime(2026, 1, 15, tzinfo=UTC)


def test_similarity_floor_is_the_higher_of_the_minimum_and_the_share_of_the_best() -> None:
    assert similarity_floor([0.8, 0.5, 0.1], None, 0.0) == -1.0
    assert similarity_floor([0.8, 0.5, 0.1], 0.3, 0.0) == 0.3
    assert similarity_floor([0.8, 0.5, 0.1], 0.3, 0.5) == pytest.approx(0.4)
    assert similarity_floor([0.4, 0.1], 0.3, 0.5) == 0.3
    # A best hit that is no match (cosine at or below 0) makes no share.
    assert similarity_floor([-0.2, -0.5], None, 0.5) == -1.0
    assert similarity_floor([-0.2, -0.5], 0.1, 0.5) == 0.1
    assert similarity_floor([], 0.2, 0.9) == 0.2


def _hit(id_: str, score: float) -> Hit:
    return Hit(id=id_, content=id_, kind="note", tier="session", created_at=T0, confidence=1.0, score=score)


def test_above_share_keeps_what_scores_a_share_of_the_best() -> None:
    hits = [_hit("a", 0.5), _hit("b", 0.1), _hit("c", 0.04)]
    assert [h.id for h in above_share(hits, 0.0)] == ["a", "b", "c"]
    assert [h.id for h in above_share(hits, 0.1)] == ["a", "b"]
    assert [h.id for h in above_share(hits, 0.2)] == ["a", "b"]
    assert [h.id for h in above_share(hits, 0.21)] == ["a"]
    assert above_share([], 0.5) == []
    assert [h.id for h in above_share([_hit("z", 0.0)], 0.5)] == ["z"]


def _plan(terms: list[str], dfs: dict[str, int], stats: CorpusStats) -> Bm25Plan:
    return Bm25Plan("current_key:=k", "k", tuple(terms), 250, 1.0, "content", stats, dict(dfs))


def test_the_keyword_floor_leaves_out_weak_matches() -> None:
    """Scores by hand (k1 1.5, b 0.75, mean length 4): "both" holds both terms,
    "rare" the rare one, "common" only the common one."""
    stats = CorpusStats(100, 4.0)
    plan = _plan(["rare", "common"], {"rare": 2, "common": 60}, stats)
    docs = [
        {"memory_id": "common", "content": "common words here too", "length": 4},
        {"memory_id": "rare", "content": "a rare one here", "length": 4},
        {"memory_id": "both", "content": "rare and common here", "length": 4},
    ]
    rare, common = idf(2, 100), idf(60, 100)
    assert plan.scores(docs) == {
        "both": pytest.approx(rare + common),
        "rare": pytest.approx(rare),
        "common": pytest.approx(common),
    }
    assert plan.ranking(docs) == ["both", "rare", "common"]
    share = common / (rare + common)  # 0.108
    assert plan.ranking(docs, share) == ["both", "rare", "common"]
    assert plan.ranking(docs, share + 0.001) == ["both", "rare"]
    assert plan.ranking(docs, 1.0) == ["both"]


def test_a_document_joins_the_keyword_candidates_as_their_filter_would_find_it() -> None:
    plan = _plan(["tea", "blend"], {"tea": 1, "blend": 1}, CorpusStats(10, 4.0))
    # The plan's tenant key is "k": a document holds its terms behind it.
    assert not plan.holds_sent({"tenant_terms": ["ktea"]})  # no candidate search sent yet
    plan.searches()
    assert plan.sent == ["tea", "blend"]
    assert plan.holds_sent({"tenant_terms": ["kearl", "ktea"]})
    assert not plan.holds_sent({"tenant_terms": ["kturn", "kchat"]})
    # Another tenant's key before the same term is not a match.
    assert not plan.holds_sent({"tenant_terms": ["xtea"]})
    assert not plan.holds_sent({})


def _record(id_: str, embedding: tuple[float, ...], model: str = "m") -> MemoryRecord:
    return MemoryRecord(
        id=id_,
        content=id_,
        kind="note",
        tier="session",
        created_at=T0,
        confidence=1.0,
        tenant="t",
        embedding=embedding,
        model=model,
    )


def test_unindexed_memories_take_their_places_in_the_vector_list() -> None:
    """Typesense's hits by ``vector_distance`` (1 - cosine); the pending ones
    by their own cosine, the same model's only; the floor on both."""
    query = SearchQuery(tenant="t", text="q", vector=(1.0, 0.0), limit=10, model="m")
    hits = [
        {"vector_distance": 0.1, "document": {"memory_id": "a", "model": "m"}},
        {"vector_distance": 0.5, "document": {"memory_id": "b", "model": "m"}},
        {"vector_distance": 0.2, "document": {"memory_id": "other-model", "model": "x"}},
        {"vector_distance": 0.9, "document": {"memory_id": "c", "model": "m"}},
    ]
    pending = [
        combined_document(_record("new", (0.8, 0.6))),
        combined_document(_record("newer-model", (1.0, 0.0), model="x")),
        combined_document(_record("far", (0.0, 1.0))),
    ]
    assert _vector_ranking(hits, query, pending, None, 10) == ["a", "new", "b", "c", "far"]
    assert _vector_ranking(hits, query, pending, 0.5, 10) == ["a", "new", "b"]
    assert _vector_ranking(hits, query, pending, None, 2) == ["a", "new"]
    assert _vector_ranking(hits, query, [], 0.5, 10) == ["a", "b"]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            "sources: {pgvector: {minSimilarity: 1.5}}",
            "Expected `float` <= 1.0 - at `$.sources.pgvector.minSimilarity`",
        ),
        (
            "sources: {pgvector: {relativeFloor: -0.1}}",
            "Expected `float` >= 0.0 - at `$.sources.pgvector.relativeFloor`",
        ),
        ("sources: {graph: {relativeFloor: 2}}", "Expected `float` <= 1.0 - at `$.sources.graph.relativeFloor`"),
        (
            "sources: {graph: {minSimilarity: 0.2}}",
            "Object contains unknown field `minSimilarity` - at `$.sources.graph`",
        ),
        (
            "sources: {typesense: {relativeFloor: 1.1}}",
            "Expected `float` <= 1.0 - at `$.sources.typesense.relativeFloor`",
        ),
    ],
)
def test_floor_keys_are_bounded(text: str, error: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, source="braid.yaml")
    assert str(caught.value) == f"braid.yaml: {error}"


def test_floor_keys_read_from_yaml() -> None:
    cfg = parse_config(
        "sources: {pgvector: {minSimilarity: 0.25, relativeFloor: 0.5}, graph: {relativeFloor: 0.1},"
        " typesense: {relativeFloor: 0.2, minSimilarity: null}}"
    )
    pg, graph, ts = cfg.source("pgvector"), cfg.source("graph"), cfg.source("typesense")
    assert (pg.min_similarity, pg.relative_floor) == (0.25, 0.5)  # type: ignore[attr-defined]
    assert graph.relative_floor == 0.1  # type: ignore[attr-defined]
    assert (ts.relative_floor, ts.min_similarity) == (0.2, None)  # type: ignore[attr-defined]
