"""The pure assembly step with exact values: floor, fusion, factors, top_k, block."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec
import pytest

from fusion import BlockItem, FactorWeights, QueryPlan, assemble, format_block, get_encoding

K = 60
T0 = datetime(2026, 1, 15, tzinfo=UTC)
ENC = get_encoding("cl100k_base")


class Hit(msgspec.Struct, frozen=True):
    id: str
    content: str
    confidence: float = 0.95
    kind: str = "note"
    created_at: datetime = T0
    speaker: str | None = None
    importance: float | None = None


H1 = Hit("h1", "first memory")
H2 = Hit("h2", "low confidence", confidence=0.3)
H3 = Hit("h3", "third memory", speaker="Ann")
H3_OTHER = Hit("h3", "the same id as another source holds it")
LISTS = {"a": [H1, H2, H3], "b": [H3_OTHER, H1], "c": []}
PLAIN = QueryPlan(text="q", speakers=(), dates=())


def run(plan: QueryPlan = PLAIN, lists: dict[str, list[Hit]] = LISTS, **changes: object):  # type: ignore[no-untyped-def]
    args: dict[str, object] = dict(
        k=K,
        weights={"a": 1.0, "b": 0.5},
        factors=FactorWeights(speaker_boost=0.5, time_boost=0.6),
        reference_time=T0,
        min_confidence=0.5,
        top_k=10,
        budget=1000,
        encoding=ENC,
    )
    args.update(changes)
    return assemble(lists, plan, **args)  # type: ignore[arg-type]


def test_floor_fusion_ranks_and_contributions() -> None:
    answer = run()
    assert [r.hit.id for r in answer.items] == ["h1", "h3"]  # h2 is under the floor
    h1, h3 = answer.items
    assert h1.contributions == {"a": pytest.approx(1 / 61), "b": pytest.approx(0.5 / 62)}
    assert h3.contributions == {"a": pytest.approx(1 / 62), "b": pytest.approx(0.5 / 61)}
    # Ranks are counted after the floor (h3 is second in `a`), every source listed.
    assert h1.ranks == {"a": 1, "b": 2, "c": None}
    assert h3.ranks == {"a": 2, "b": 1, "c": None}
    assert h1.score == h1.rrf_score == pytest.approx(1 / 61 + 0.5 / 62)
    # The first source's hit is the one shown.
    assert h3.hit is H3
    assert (h1.factors, h3.factors) == ({}, {})


def test_factors_reorder_and_top_k_cuts() -> None:
    plan = QueryPlan(text="q", speakers=("ann",), dates=())
    answer = run(plan, top_k=1)
    (only,) = answer.items
    assert only.hit.id == "h3"
    assert only.factors == {"speaker": 1.5}
    assert only.score == pytest.approx((1 / 62 + 0.5 / 61) * 1.5)


def test_the_block_is_the_budgeted_top() -> None:
    answer = run()
    expected = format_block(
        [BlockItem(kind="note", created_at=T0, content=h.content, confidence=0.95) for h in (H1, H3)], 1000, ENC
    )
    assert (answer.block, answer.tokens) == (expected.text, expected.tokens)
    assert [r.in_block for r in answer.items] == [True, True]
    tight = run(budget=expected.tokens - 1)
    assert tight.tokens <= expected.tokens - 1
    assert [r.in_block for r in tight.items] != [True, True] or any(r.truncated for r in tight.items)


def test_an_unweighted_source_counts_one_and_nothing_found_is_empty() -> None:
    answer = run(weights={})
    h1 = answer.items[0]
    assert h1.contributions == {"a": pytest.approx(1 / 61), "b": pytest.approx(1 / 62)}
    empty = run(lists={"a": []}, top_k=5, budget=100)
    assert (empty.items, empty.block, empty.tokens) == ([], "", 0)
