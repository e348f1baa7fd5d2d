"""Query analysis and post-fusion factors: exact expected values."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from fusion import QueryPlan, analyze_query, date_ranges, relative_ranges, score_factors
from fusion.query import speaks_for_self


@pytest.mark.parametrize(
    ("text", "ranges"),
    [
        ("on 13 October 2023", [(date(2023, 10, 13), date(2023, 10, 13))]),
        ("on October 13, 2023", [(date(2023, 10, 13), date(2023, 10, 13))]),
        ("on December 1,2023", [(date(2023, 12, 1), date(2023, 12, 1))]),
        ("on 1 December,2023", [(date(2023, 12, 1), date(2023, 12, 1))]),
        ("in December,2023", [(date(2023, 12, 1), date(2023, 12, 31))]),
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
        speakers=("Caroline",),
        dates=((date(2023, 10, 13), date(2023, 10, 13)),),
        others=("Melanie",),  # the other party of Caroline's act: not boosted
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


TODAY = date(2023, 4, 18)


@pytest.mark.parametrize(
    ("text", "ranges"),
    [
        ("what did I say yesterday?", [(date(2023, 4, 17), date(2023, 4, 17))]),
        ("the day before yesterday", [(date(2023, 4, 16), date(2023, 4, 16))]),
        ("a couple of days ago", [(date(2023, 4, 16), date(2023, 4, 16))]),
        ("3 Days Ago", [(date(2023, 4, 14), date(2023, 4, 16))]),
        ("the event I went to a week ago", [(date(2023, 4, 9), date(2023, 4, 13))]),
        ("an investment four weeks ago", [(date(2023, 3, 14), date(2023, 3, 28))]),
        ("What charity event did I join a month ago?", [(date(2023, 3, 11), date(2023, 3, 27))]),
        ("a year ago", [(date(2022, 1, 17), date(2022, 7, 18))]),
        ("12 years ago", [(date(2008, 4, 17), date(2014, 4, 18))]),  # 4383 days, 1096 either side
        (
            "yesterday and two days ago",
            [(date(2023, 4, 17), date(2023, 4, 17)), (date(2023, 4, 16), date(2023, 4, 16))],
        ),
        ("How many days ago did I watch it?", []),  # no count: no offset
        ("a few days ago", []),
        ("an hour ago", []),
        ("years later, ago", []),
    ],
)
def test_relative_ranges(text: str, ranges: list[tuple[date, date]]) -> None:
    assert relative_ranges(text, TODAY) == ranges


def test_a_relative_window_never_reaches_past_today() -> None:
    assert all(last <= TODAY for _, last in relative_ranges("3 days ago, a week ago, 4000 days ago", TODAY))


def test_analyze_reads_relative_dates_only_against_a_day_and_keeps_their_words() -> None:
    text = "What charity event did I join a month ago, on 2 March 2023?"
    assert analyze_query(text).dates == ((date(2023, 3, 2), date(2023, 3, 2)),)
    plan = analyze_query(text, today=TODAY)
    assert plan.dates == ((date(2023, 3, 2), date(2023, 3, 2)), (date(2023, 3, 11), date(2023, 3, 27)))
    assert plan.text == "What charity event did I join a month ago, on ?"


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


SPEAKERS = ["Melanie", "Caroline", "Jon"]


@pytest.mark.parametrize(
    ("text", "about", "spoken_to", "searched"),
    [
        # Addressed: a greeting right before the name, or the name alone in its clause.
        ("Thanks, Melanie!", (), ("Melanie",), "Thanks, !"),
        ("Thank you Melanie", (), ("Melanie",), "Thank you"),
        ("Thanks Melanie for the tip", (), ("Melanie",), "Thanks for the tip"),
        ("Hi Melanie", (), ("Melanie",), "Hi"),
        ("Good morning Melanie!", (), ("Melanie",), "Good morning !"),
        ("Melanie, what do you think?", (), ("Melanie",), ", what do you think?"),
        ("What do you think, Melanie?", (), ("Melanie",), "What do you think, ?"),
        ("So, Melanie, how was camping?", (), ("Melanie",), "So, , how was camping?"),
        ("I love it, Melanie. What did you paint?", (), ("Melanie",), "I love it, . What did you paint?"),
        # A speaker label says who speaks, not whom the text is about.
        ("Melanie: thanks, Caroline!", (), ("Caroline", "Melanie"), ": thanks, !"),
        # About them: a name inside its clause, a possessive, a list of names.
        ("What did Melanie paint?", ("Melanie",), (), "What did paint?"),
        ("Did you call Melanie?", ("Melanie",), (), "Did you call ?"),
        ("No, Melanie painted it.", ("Melanie",), (), "No, painted it."),
        ("So Melanie went home", ("Melanie",), (), "So went home"),
        ("Melanie's dog", ("Melanie",), (), "dog"),
        ("Melanie, Caroline and Jon went hiking", ("Caroline", "Jon", "Melanie"), (), ", and went hiking"),
        ("When did Caroline meet Melanie?", ("Caroline", "Melanie"), (), "When did meet ?"),
        # Both in one text: whom it talks to, and whom it is about.
        ("Thanks, Melanie! What did Caroline paint?", ("Caroline",), ("Melanie",), "Thanks, ! What did paint?"),
        ("Hey Melanie, what did Caroline paint?", ("Caroline",), ("Melanie",), "Hey , what did paint?"),
        # Nothing but the name: it is what the text is about (and the text stays whole).
        ("Melanie?", ("Melanie",), (), "Melanie?"),
    ],
)
def test_a_name_used_to_address_someone_is_not_what_the_query_is_about(
    text: str, about: tuple[str, ...], spoken_to: tuple[str, ...], searched: str
) -> None:
    plan = analyze_query(text, SPEAKERS)
    assert (plan.speakers, plan.addressed, plan.text) == (about, spoken_to, searched)


@pytest.mark.parametrize(
    ("text", "about", "others"),
    [
        # The other party of a named speaker's act: after to/with/for, or possessive.
        ("What book did Caroline recommend to Melanie?", ("Caroline",), ("Melanie",)),
        ("What does Gina say to Jon about the opening?", ("Gina",), ("Jon",)),
        ("What did Caroline share with her friend Melanie?", ("Caroline",), ("Melanie",)),
        ("What did Jon buy for Gina?", ("Jon",), ("Gina",)),
        ("What does Melanie think about Caroline's decision?", ("Melanie",), ("Caroline",)),
        # Joined to another name, after "according to", or every name so: all are boosted.
        ("Who is Caroline and Melanie's favourite painter?", ("Caroline", "Melanie"), ()),
        ("Was it a good month for Jon and Gina?", ("Gina", "Jon"), ()),
        ("According to Gina, what makes Jon a good mentor?", ("Gina", "Jon"), ()),
        ("Caroline's gift to Melanie?", ("Caroline", "Melanie"), ()),
        ("When did Caroline meet Melanie?", ("Caroline", "Melanie"), ()),
        # One speaker alone is what the query is about, however it is named.
        ("What did you recommend to Melanie?", ("Melanie",), ()),
        ("What are Caroline's plans?", ("Caroline",), ()),
    ],
)
def test_a_speaker_named_only_as_the_other_party_of_anothers_act_is_not_boosted(
    text: str, about: tuple[str, ...], others: tuple[str, ...]
) -> None:
    speakers = [*SPEAKERS, "Gina"]
    plan = analyze_query(text, speakers)
    assert (plan.speakers, plan.others, plan.addressed) == (about, others, ())
    assert not any(name in plan.text for name in speakers)


def test_an_addressed_speaker_is_not_boosted() -> None:
    said = datetime(2023, 5, 1, tzinfo=UTC)
    addressed = analyze_query("Thanks, Melanie!", SPEAKERS)
    about = analyze_query("What did Melanie paint?", SPEAKERS)
    for plan, factors in ((addressed, {}), (about, {"speaker": 1.5})):
        assert (
            score_factors(
                speaker="Melanie",
                created_at=said,
                speakers=plan.speakers,
                dates=plan.dates,
                speaker_boost=0.5,
                time_boost=0.6,
            )
            == factors
        )


@pytest.mark.parametrize(
    ("text", "own"),
    [
        ("Have I ever used WillMaker Pro to draft my will?", True),
        ("What did I buy last week?", True),
        ("I\u2019m trying to remember the hotel", True),
        ("Can you tell me where my keys are?", True),
        ("remind me of the plan", True),
        ("What is the source of truth?", False),
        ("What did Melanie paint?", False),
        ("Can you remind me what you recommended for my trip?", False),
        ("You told me about a hotel; which one was it?", False),
        ("What did you just say about my sister?", False),
        ("I was wondering, what was the move you made after 27. Kg2?", False),
        ("iMac or Mimi", False),
    ],
)
def test_a_query_in_the_first_person_speaks_for_itself(text: str, own: bool) -> None:
    assert speaks_for_self(text) is own


def test_the_first_person_means_the_self_speakers_the_tenant_has() -> None:
    speakers = ["user", "assistant", "Melanie"]
    plan = analyze_query("What did I decide about my will?", speakers, self_names=["USER"])
    assert plan.selves == ("user",)
    assert plan.speakers == ()
    # Not without the name configured, nor when the tenant has no such speaker.
    assert analyze_query("What did I decide?", speakers).selves == ()
    assert analyze_query("What did I decide?", ["Melanie"], self_names=["user"]).selves == ()
    # A query about a known speaker is about them, not its own speaker.
    named = analyze_query("What did Melanie tell me?", speakers, self_names=["user"])
    assert (named.speakers, named.selves) == (("Melanie",), ())
    # Addressing someone does not make the query about them.
    thanked = analyze_query("Thanks, Melanie! What did I say?", speakers, self_names=["user"])
    assert (thanked.speakers, thanked.addressed, thanked.selves) == ((), ("Melanie",), ("user",))


def test_the_self_factor_boosts_the_self_speakers_memories() -> None:
    from fusion import FactorWeights, apply_factors, rrf

    fused = rrf({"a": ["x", "y"]}, k=60)
    memories = {
        "x": ("assistant", datetime(2023, 3, 1, tzinfo=UTC), None),
        "y": ("User", datetime(2023, 3, 1, tzinfo=UTC), None),
    }
    plan = QueryPlan(text="my will", selves=("user",))
    ranked = apply_factors(fused, memories, plan, FactorWeights(self_boost=0.5), datetime(2024, 1, 1, tzinfo=UTC))
    assert [(s.fused.id, s.factors) for s in ranked] == [("y", {"self": 1.5}), ("x", {})]
    assert [s.score for s in ranked] == pytest.approx([1.5 / 62, 1 / 61])
    # Off: no factor.
    off = apply_factors(fused, memories, plan, FactorWeights(), datetime(2024, 1, 1, tzinfo=UTC))
    assert [(s.fused.id, s.factors) for s in off] == [("x", {}), ("y", {})]
