"""The recency, importance and usage factors with exact values, alone and in the assembly."""

from __future__ import annotations

import math
from datetime import UTC, date, datetime, timedelta

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusion import FactorWeights, QueryPlan, assemble, get_encoding, rank
from fusion.factors import (
    apply_factors,
    importance_factor,
    memory_factors,
    recency_factor,
    score_factors,
    states_change,
    usage_factor,
)
from fusion.rrf import rrf

NOW = datetime(2026, 1, 15, 12, tzinfo=UTC)
ENC = get_encoding("cl100k_base")
PLAIN = QueryPlan(text="q", speakers=(), dates=())
NOW_QUERY = QueryPlan(text="q", current=True)


@pytest.mark.parametrize(
    ("age_days", "expected"),
    [
        (0, 1.2),  # a memory of now: 1 + w
        (30, 1.1),  # one half-life: 1 + w/2
        (90, 1.05),  # three: 1 + w/4
        (-5, 1.2),  # after the reference time counts as now
    ],
)
def test_recency_is_hyperbolic_in_age(age_days: float, expected: float) -> None:
    assert recency_factor(NOW - timedelta(days=age_days), NOW, 0.2, 30.0) == pytest.approx(expected)


def test_recency_still_orders_old_memories() -> None:
    nine_months, three_months = (recency_factor(NOW - timedelta(days=d), NOW, 0.2, 30.0) for d in (270, 90))
    assert three_months > nine_months > 1.0
    assert nine_months == pytest.approx(1.02)


@pytest.mark.parametrize(("importance", "expected"), [(0.5, 1.0), (1.0, 1.3), (0.0, 0.7), (0.75, 1.15)])
def test_importance_is_neutral_at_one_half(importance: float, expected: float) -> None:
    assert importance_factor(importance, 0.3) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (1, 1 + 0.1 * math.log(2) / math.log(101)),
        (100, 1.1),  # saturation
        (10_000, 1.1),  # capped
    ],
)
def test_usage_is_log_scaled_and_capped(count: int, expected: float) -> None:
    assert usage_factor(count, 0.1, 100) == pytest.approx(expected)


def test_memory_factors_name_only_what_applies() -> None:
    weights = FactorWeights(recency=0.2, recency_half_life_days=30.0, importance=0.3)
    old = NOW - timedelta(days=30)
    assert memory_factors(created_at=old, importance=None, reference_time=NOW, weights=weights) == {
        "recency": pytest.approx(1.1)
    }
    assert memory_factors(created_at=old, importance=1.0, reference_time=NOW, weights=weights) == {
        "recency": pytest.approx(1.1),
        "importance": pytest.approx(1.3),
    }
    assert memory_factors(created_at=old, importance=1.0, reference_time=NOW, weights=FactorWeights()) == {}


@pytest.mark.parametrize(
    "bad",
    [
        {"recency": -0.1},
        {"usage": math.inf},
        {"importance": 1.0},
        {"recency_half_life_days": 0.0},
        {"usage_saturation": 0},
    ],
)
def test_bad_weights_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        FactorWeights(**bad)  # type: ignore[arg-type]


class Hit(msgspec.Struct, frozen=True):
    id: str
    created_at: datetime
    importance: float | None = None
    content: str = "text"
    confidence: float = 1.0
    kind: str = "turn"
    speaker: str | None = None


OLD = Hit("old", NOW - timedelta(days=300))
NEW = Hit("new", NOW - timedelta(days=10))


def _answer(  # type: ignore[no-untyped-def]
    lists: dict[str, list[Hit]],
    weights: FactorWeights,
    usage: dict[str, int] | None = None,
    top_k: int = 10,
    plan: QueryPlan = PLAIN,
    vectors: dict[str, np.ndarray] | None = None,
):
    return assemble(
        lists,
        plan,
        k=60,
        weights={},
        factors=weights,
        reference_time=NOW,
        min_confidence=0.0,
        top_k=top_k,
        budget=1000,
        encoding=ENC,
        usage=usage,
        vectors=vectors,
    )


def test_recency_puts_the_newer_of_two_close_matches_first() -> None:
    off = _answer({"a": [OLD, NEW]}, FactorWeights())
    assert [r.hit.id for r in off.items] == ["old", "new"]
    on = _answer({"a": [OLD, NEW]}, FactorWeights(recency=0.2, recency_half_life_days=30.0))
    assert [r.hit.id for r in on.items] == ["new", "old"]
    new, old = on.items
    assert new.factors == {"recency": pytest.approx(1 + 0.2 * 30 / 40)}
    assert new.score == pytest.approx(1 / 62 * (1 + 0.2 * 30 / 40))
    assert old.score == pytest.approx(1 / 61 * (1 + 0.2 * 30 / 330))


def test_recency_does_not_lift_a_weak_new_match_over_a_strong_old_one() -> None:
    filler = [Hit(f"f{i}", NOW - timedelta(days=300)) for i in range(20)]
    answer = _answer({"a": [OLD, *filler, NEW]}, FactorWeights(recency=0.2, recency_half_life_days=30.0))
    assert answer.items[0].hit.id == "old"


def test_importance_reorders_and_none_is_neutral() -> None:
    plain, important = Hit("plain", NOW), Hit("important", NOW, importance=0.9)
    answer = _answer({"a": [plain, important]}, FactorWeights(importance=0.3))
    assert [r.hit.id for r in answer.items] == ["important", "plain"]
    assert answer.items[0].factors == {"importance": pytest.approx(1.24)}
    assert answer.items[1].factors == {}


def test_usage_is_applied_from_the_counts_given() -> None:
    a, b = Hit("a", NOW), Hit("b", NOW)
    weights = FactorWeights(usage=0.1, usage_saturation=100)
    answer = _answer({"s": [a, b]}, weights, usage={"b": 100})
    assert [r.hit.id for r in answer.items] == ["b", "a"]
    assert answer.items[0].factors == {"usage": pytest.approx(1.1)}
    assert answer.items[0].score == pytest.approx(1.1 / 62)
    assert answer.items[1].factors == {}


def test_usage_ids_are_only_those_that_could_reach_the_top() -> None:
    hits = [Hit(f"h{i}", NOW) for i in range(40)]
    ranking = rank(
        {"s": hits},
        PLAIN,
        k=60,
        weights={},
        factors=FactorWeights(usage=0.1),
        reference_time=NOW,
        min_confidence=0.0,
    )
    wanted = ranking.usage_ids(top_k=5)
    # 1/(60+r) * 1.1 >= 1/65  <=>  r <= 11.5: ranks 1-11.
    assert wanted == [f"h{i}" for i in range(11)]
    off = rank({"s": hits}, PLAIN, k=60, weights={}, factors=FactorWeights(), reference_time=NOW, min_confidence=0.0)
    assert off.usage_ids(top_k=5) == []


def test_order_reorders_the_shortlist_by_time_and_keeps_its_members() -> None:
    t = [NOW - timedelta(days=d) for d in (5, 1, 3, 0)]
    hits = [Hit(f"h{i}", t[i]) for i in range(4)]  # h3 is the newest, outside the window
    weights = FactorWeights(order=0.1, order_window=3)
    assert all(r.factors == {} for r in _answer({"s": hits}, weights).items)  # a question about the past
    answer = _answer({"s": hits}, weights, plan=NOW_QUERY)
    # In the window h0 (oldest, 1.0), h2 (1.05), h1 (newest, 1.1).
    # h0 1/61 = 0.01639, h1 1.1/62 = 0.01774, h2 1.05/63 = 0.01667.
    assert [r.hit.id for r in answer.items] == ["h1", "h2", "h0", "h3"]
    by_id = {r.hit.id: r for r in answer.items}
    assert by_id["h1"].factors == {"order": pytest.approx(1.1)}
    assert by_id["h2"].factors == {"order": pytest.approx(1.05)}
    assert by_id["h0"].factors == {}
    assert by_id["h1"].score == pytest.approx(1.1 / 62)
    assert by_id["h3"].factors == {}  # outside the shortlist: untouched, still last


def test_order_leaves_equal_times_alone() -> None:
    same = [Hit(f"h{i}", NOW) for i in range(3)]
    answer = _answer({"s": same}, FactorWeights(order=0.5), plan=NOW_QUERY)
    assert [r.hit.id for r in answer.items] == ["h0", "h1", "h2"]
    assert all(r.factors == {} for r in answer.items)


def _unit(*xs: float) -> np.ndarray:
    v = np.array(xs, dtype=np.float32)
    return v / np.linalg.norm(v)


def test_restatements_take_their_places_newest_first_and_nothing_else_moves() -> None:
    # h0 (old value) and h2 (the new value, 1 day later) restate each other (cosine 0.8);
    # h1 and h3 are unrelated (cosine 0.6 and 0 with h0).
    t = [NOW - timedelta(days=d) for d in (5, 1, 4, 0)]
    hits = [Hit(f"h{i}", t[i]) for i in range(4)]
    vectors = {"h0": _unit(1, 0, 0), "h1": _unit(0.6, 0.8, 0), "h2": _unit(0.8, 0, 0.6), "h3": _unit(0, 0, 1)}
    weights = FactorWeights(restatement_similarity=0.7)
    off = _answer({"s": hits}, weights)  # no vectors: nothing read, nothing moves
    assert [r.hit.id for r in off.items] == ["h0", "h1", "h2", "h3"]
    answer = _answer({"s": hits}, weights, vectors=vectors)
    # h2 and h3 have cosine 0.6 too: below 0.7, so h3 joins no group.
    assert [r.hit.id for r in answer.items] == ["h2", "h1", "h0", "h3"]
    by_id = {r.hit.id: r for r in answer.items}
    assert by_id["h2"].score == pytest.approx(1 / 61)
    assert by_id["h2"].factors == {"restated": pytest.approx(63 / 61)}
    assert by_id["h0"].score == pytest.approx(1 / 63)
    assert by_id["h0"].factors == {"restated": pytest.approx(61 / 63)}
    assert by_id["h1"].factors == {} and by_id["h3"].factors == {}
    for r in answer.items:
        assert r.score == pytest.approx(r.rrf_score * math.prod(r.factors.values()))


def test_restatements_join_transitively_inside_the_window_only() -> None:
    t = [NOW - timedelta(days=d) for d in (3, 2, 1, 0)]
    hits = [Hit(f"h{i}", t[i]) for i in range(4)]
    # h0~h1 (0.8) and h1~h2 (0.8) but h0.h2 = 0.28: one group by the chain. h3 (the newest,
    # same vector as h2) is outside a window of 3 and stays last.
    vectors = {"h0": _unit(1, 0, 0), "h1": _unit(0.8, 0.6, 0), "h2": _unit(0.28, 0.96, 0), "h3": _unit(0.28, 0.96, 0)}
    answer = _answer({"s": hits}, FactorWeights(restatement_similarity=0.75, restatement_window=3), vectors=vectors)
    assert [r.hit.id for r in answer.items] == ["h2", "h1", "h0", "h3"]
    assert answer.items[1].factors == {}  # h1 is in its own place


@pytest.mark.parametrize(
    ("newer", "older", "change"),
    [
        ("I now have a total of 10 cards.", "The gallery has 8 cards.", True),  # a new number
        ("I have some new photos now.", "I have photos.", False),  # "now" and "new" say nothing
        ("The gallery will have 10 cards.", "The gallery has 8 cards.", True),  # a new number
        ("It's been rescheduled to Friday.", "The meeting is on Thursday.", True),  # a word of change
        ("The gallery has 8 cards, all in a grid.", "The gallery has 8 cards.", False),  # the same number
        ("I love the gallery.", "I built the gallery.", False),
        ("It has 10 cards.", "The gallery is done.", False),  # the older names no number
    ],
)
def test_states_change(newer: str, older: str, change: bool) -> None:
    assert states_change(newer, older) is change


def test_restatements_that_state_no_change_keep_their_places() -> None:
    older = Hit("older", NOW - timedelta(minutes=5), content="The standup is at 9am every day.")
    echo = Hit("echo", NOW - timedelta(minutes=1), content="Yes, the standup at 9am every day works.")
    moved = Hit("moved", NOW, content="The standup was moved to 10am.")
    vectors = {"older": _unit(1, 0, 0), "echo": _unit(0.9, 0.1, 0), "moved": _unit(0.9, 0, 0.1)}
    gated = FactorWeights(restatement_similarity=0.7, restatement_needs_change=True)
    assert [r.hit.id for r in _answer({"s": [older, echo]}, gated, vectors=vectors).items] == ["older", "echo"]
    ungated = FactorWeights(restatement_similarity=0.7)
    assert [r.hit.id for r in _answer({"s": [older, echo]}, ungated, vectors=vectors).items] == ["echo", "older"]
    # A newer memory stating a change still takes the older one's place.
    assert [r.hit.id for r in _answer({"s": [older, moved]}, gated, vectors=vectors).items] == ["moved", "older"]


def test_memories_of_different_speakers_never_restate_each_other() -> None:
    said = Hit("said", NOW - timedelta(minutes=5), content="My budget is $35.", speaker="user")
    echoed = Hit("echoed", NOW, content="Your budget is now $50.", speaker="assistant")
    restated = Hit("restated", NOW, content="My budget is now $50.", speaker="user")
    vectors = {"said": _unit(1, 0), "echoed": _unit(0.95, 0.05), "restated": _unit(0.95, 0.05)}
    weights = FactorWeights(restatement_similarity=0.7, restatement_needs_change=True)
    assert [r.hit.id for r in _answer({"s": [said, echoed]}, weights, vectors=vectors).items] == ["said", "echoed"]
    assert [r.hit.id for r in _answer({"s": [said, restated]}, weights, vectors=vectors).items] == [
        "restated",
        "said",
    ]


def test_restatement_ids_follow_the_gate_and_the_window() -> None:
    hits = [Hit(f"h{i}", NOW) for i in range(5)]

    def ranking(weights: FactorWeights, plan: QueryPlan = PLAIN):  # type: ignore[no-untyped-def]
        return rank({"s": hits}, plan, k=60, weights={}, factors=weights, reference_time=NOW, min_confidence=0.0)

    assert ranking(FactorWeights()).restatement_ids({}) == []
    assert ranking(FactorWeights(restatement_similarity=0.7, restatement_window=3)).restatement_ids({}) == [
        "h0",
        "h1",
        "h2",
    ]
    gated = FactorWeights(restatement_similarity=0.7, restatement_current_only=True)
    assert ranking(gated).restatement_ids({}) == []
    assert len(ranking(gated, NOW_QUERY).restatement_ids({})) == 5
    with pytest.raises(ValueError):
        FactorWeights(restatement_similarity=1.5)


@pytest.mark.parametrize(
    ("question", "current"),
    [
        ("What is my monthly budget for books?", True),
        ("How many books do I have?", True),
        ("When is my session with the consultant scheduled?", True),
        ("Which city did I move to first?", False),
        ("What was my budget in January?", False),
        ("What has Maria done to feel closer to her faith?", False),
        ("How many commits have been merged?", False),
        ("What did I buy, and where do I keep it now?", True),
        ("What’s my current job?", True),
    ],
)
def test_asks_current(question: str, current: bool) -> None:
    from fusion import asks_current

    assert asks_current(question) is current


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([None, "Ana", "ana", "Bo"]),
            st.integers(-400, 400),
            st.none() | st.floats(0.0, 1.0),
        ),
        min_size=1,
        max_size=12,
    ),
    st.sampled_from([0.0, 0.3]),
    st.sampled_from([0.0, 0.5]),
    st.sampled_from([0.0, 0.2]),
    st.sampled_from([0.0, 0.4]),
    st.sampled_from([0.0, 0.25]),
)
def test_apply_factors_are_score_factors_times_memory_factors(
    memories: list[tuple[str | None, int, float | None]],
    speaker_boost: float,
    time_boost: float,
    recency: float,
    importance: float,
    self_boost: float,
) -> None:
    """The loop over the candidates gives each the factors score_factors and
    memory_factors name, and the fused score times their product, to the bit."""
    weights = FactorWeights(
        speaker_boost=speaker_boost,
        time_boost=time_boost,
        recency=recency,
        importance=importance,
        self_boost=self_boost,
    )
    plan = QueryPlan(text="q", speakers=("ANA",), dates=((date(2026, 1, 1), date(2026, 1, 10)),), selves=("bo",))
    memory = {
        f"m{i}": (speaker, NOW + timedelta(hours=7 * hours), imp) for i, (speaker, hours, imp) in enumerate(memories)
    }
    fused = rrf({"a": list(memory), "b": list(reversed(memory))[::2]}, k=60)
    for s in apply_factors(fused, memory, plan, weights, NOW):
        speaker, created_at, imp = memory[s.fused.id]
        expected = score_factors(
            speaker=speaker,
            created_at=created_at,
            speakers=plan.speakers,
            dates=plan.dates,
            speaker_boost=speaker_boost,
            time_boost=time_boost,
            selves=plan.selves,
            self_boost=self_boost,
        )
        expected.update(memory_factors(created_at=created_at, importance=imp, reference_time=NOW, weights=weights))
        assert s.factors == expected
        assert list(s.factors) == list(expected)
        assert s.score == s.fused.score * math.prod(expected.values())
