"""Query analysis and post-fusion factors: exact expected values."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from fusion import QueryPlan, analyze_query, date_ranges, score_factors


@pytest.mark.parametrize(
    ("text", "ranges"),
    [
        ("on 13 October 2023", [(date(2023, 10, 13), date(2023, 10, 13))]),
        ("on October 13, 2023", [(date(2023, 10, 13), date(2023, 10, 13))]),
        ("the 1st of Feb. 2024", [(date(2024, 2, 1), date(2024, 2, 1))]),
        ("in July 2023", [(date(2023, 7, 1), date(2023, 7, 31))]),
        ("in February, 2024", [(date(2024, 2, 1), date(2024, 2, 29))]),
        ("recently in 2024", [(date(2024, 1, 1), date(2024, 12, 31))]),
        ("between May 2023 and 2024", [(date(2023, 5, 1), date(2023, 5, 31)), (date(2024, 1, 1), date(2024, 12, 31))]),
        ("on 31 February 2023", []),
        ("in may", []),
        ("room 12345", []),
    ],
)
def test_date_ranges(text: str, ranges: list[tuple[date, date]]) -> None:
    assert date_ranges(text)[0] == ranges


def test_date_spans_cover_the_date_words() -> None:
    text = "What did Gina find on 1 February, 2023?"
    ranges, spans = date_ranges(text)
    assert [text[a:b] for a, b in spans] == ["1 February, 2023"]


def test_analyze_strips_named_speakers_and_dates() -> None:
    plan = analyze_query(
        "What kind of painting did Caroline share with Melanie's friends on October 13, 2023?",
        ["Caroline", "Melanie", "Jon"],
    )
    assert plan == QueryPlan(
        text="What kind of painting did share with friends on ?",
        speakers=("Caroline", "Melanie"),
        dates=((date(2023, 10, 13), date(2023, 10, 13)),),
    )


def test_analyze_matches_whole_words_any_case() -> None:
    plan = analyze_query("what does JON like? Jonathan too", ["Jon", "Nate"])
    assert plan.speakers == ("Jon",)
    assert plan.text == "what does like? Jonathan too"


def test_analyze_prefers_the_longest_name() -> None:
    plan = analyze_query("Did Mary Ann call Mary?", ["Mary", "Mary Ann"])
    assert plan.speakers == ("Mary", "Mary Ann")
    assert plan.text == "Did call ?"


def test_analyze_keeps_text_when_nothing_would_be_left() -> None:
    plan = analyze_query("Caroline 2023", ["Caroline"])
    assert plan.text == "Caroline 2023"
    assert plan.speakers == ("Caroline",)
    assert plan.dates == ((date(2023, 1, 1), date(2023, 12, 31)),)


def test_analyze_without_stripping_reports_but_keeps() -> None:
    text = "What did Caroline do in July 2023?"
    plan = analyze_query(text, ["Caroline"], strip_speakers=False, strip_dates=False)
    assert plan.text == text
    assert plan.speakers == ("Caroline",)
    assert plan.dates == ((date(2023, 7, 1), date(2023, 7, 31)),)


def test_analyze_treats_regex_characters_in_names_literally() -> None:
    plan = analyze_query("what did a.b say", ["a.b", "x+"])
    assert plan.speakers == ("a.b",)
    assert plan.text == "what did say"


JULY_5 = datetime(2023, 7, 5, 23, 59, tzinfo=UTC)


@pytest.mark.parametrize(
    ("speaker", "created_at", "expected"),
    [
        ("Caroline", JULY_5, {"speaker": 1.5, "time": 1.6}),
        ("caroline", JULY_5, {"speaker": 1.5, "time": 1.6}),
        ("Melanie", JULY_5, {"time": 1.6}),
        (None, datetime(2023, 8, 1, tzinfo=UTC), {}),
        ("Caroline", datetime(2023, 6, 30, 23, 59, tzinfo=UTC), {"speaker": 1.5}),
    ],
)
def test_score_factors(speaker: str | None, created_at: datetime, expected: dict[str, float]) -> None:
    got = score_factors(
        speaker=speaker,
        created_at=created_at,
        speakers=["Caroline"],
        dates=[(date(2023, 7, 1), date(2023, 7, 31))],
        speaker_boost=0.5,
        time_boost=0.6,
    )
    assert got == expected


def test_zero_boosts_apply_nothing() -> None:
    got = score_factors(
        speaker="Caroline",
        created_at=JULY_5,
        speakers=["Caroline"],
        dates=[(date(2023, 7, 5), date(2023, 7, 5))],
        speaker_boost=0.0,
        time_boost=0.0,
    )
    assert got == {}


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf")])
def test_bad_boost_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="speaker_boost"):
        score_factors(speaker=None, created_at=JULY_5, speakers=[], dates=[], speaker_boost=bad, time_boost=0)


def test_apply_factors_reranks_every_candidate() -> None:
    from fusion import FactorWeights, apply_factors, rrf

    fused = rrf({"a": ["x", "y", "z"]}, k=60)
    memories = {
        "x": ("Melanie", datetime(2023, 3, 1, tzinfo=UTC), None),
        "y": ("Melanie", datetime(2023, 7, 2, tzinfo=UTC), None),
        "z": ("Caroline", datetime(2023, 7, 3, tzinfo=UTC), None),
    }
    plan = QueryPlan(text="paint", speakers=("Caroline",), dates=((date(2023, 7, 1), date(2023, 7, 31)),))
    weights = FactorWeights(speaker_boost=0.5, time_boost=0.6)
    ranked = apply_factors(fused, memories, plan, weights, datetime(2024, 1, 1, tzinfo=UTC))
    assert [(s.fused.id, s.factors) for s in ranked] == [
        ("z", {"speaker": 1.5, "time": 1.6}),
        ("y", {"time": 1.6}),
        ("x", {}),
    ]
    assert [s.score for s in ranked] == pytest.approx([1.5 * 1.6 / 63, 1.6 / 62, 1 / 61])
