"""The LongMemEval suite: its date parser, the turn-to-memory mapping and the per-question figures."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from benchmarks.quality.locomo import MappingOptions
from benchmarks.quality.suites.longmemeval import LongMemEval, parse_lme_date, score_question


def test_parse_lme_date() -> None:
    assert parse_lme_date("2023/05/30 (Tue) 03:16") == datetime(2023, 5, 30, 3, 16, tzinfo=UTC)
    assert parse_lme_date("2023/12/01 (Fri) 23:59") == datetime(2023, 12, 1, 23, 59, tzinfo=UTC)
    with pytest.raises(ValueError, match=r"^unrecognized LongMemEval date: '2023-05-30 03:16'$"):
        parse_lme_date("2023-05-30 03:16")


def _turn(role: str, content: str, has_answer: bool | None = None) -> dict[str, Any]:
    turn: dict[str, Any] = {"role": role, "content": content}
    if has_answer is not None:
        turn["has_answer"] = has_answer
    return turn


def _question(**overrides: Any) -> dict[str, Any]:
    """Three sessions: a filler (f1), the answer session, and f1 again at a later date."""
    q = {
        "question_id": "q1",
        "question_type": "multi-session",
        "question": "Where did I park?",
        "question_date": "2023/05/30 (Tue) 03:16",
        "answer": "level 2",
        "answer_session_ids": ["answer_a"],
        "haystack_dates": ["2023/05/20 (Sat) 15:08", "2023/05/21 (Sun) 00:51", "2023/05/22 (Mon) 09:00"],
        "haystack_session_ids": ["f1", "answer_a", "f1"],
        "haystack_sessions": [
            [_turn("user", "hello"), _turn("assistant", "hi there")],
            [
                _turn("user", "I parked on level 2", True),
                _turn("assistant", "Noted: level 2", True),
                _turn("user", "thanks", False),
            ],
            [_turn("user", "hello"), _turn("assistant", "hi there")],
        ],
    }
    return {**q, **overrides}


@pytest.fixture
def suite(tmp_path: Path) -> LongMemEval:
    data = tmp_path / "lme.json"
    data.write_text(json.dumps([_question(), _question(question_id="q2", question_type="knowledge-update")]))
    return LongMemEval(data)


def test_mapping_keys_turns_by_position_and_dates_them(suite: LongMemEval) -> None:
    memories, cut = suite.memories("lme-q1", MappingOptions(), 32768, 64)
    assert cut == 0
    assert [m["id"] for m in memories] == [
        "lme-q1:0:0",
        "lme-q1:0:1",
        "lme-q1:1:0",
        "lme-q1:1:1",
        "lme-q1:1:2",
        "lme-q1:2:0",
        "lme-q1:2:1",
    ]
    # The duplicated filler keeps its session id but gets its own memory ids and date.
    assert [m["session_id"] for m in memories] == ["f1", "f1", "answer_a", "answer_a", "answer_a", "f1", "f1"]
    assert [m["created_at"] for m in memories[:5]] == [
        "2023-05-20T15:08:00Z",
        "2023-05-20T15:08:01Z",
        "2023-05-21T00:51:00Z",
        "2023-05-21T00:51:01Z",
        "2023-05-21T00:51:02Z",
    ]
    assert memories[5]["created_at"] == "2023-05-22T09:00:00Z"
    assert [m["speaker"] for m in memories[2:5]] == ["user", "assistant", "user"]
    m = memories[3]
    assert (m["content"], m["kind"], m["tier"]) == ("Noted: level 2", "turn", "session")
    # Context: two turns before, one after, within the session only.
    assert m["context"] == "I parked on level 2\nthanks"
    assert "context" not in suite.memories("lme-q1", MappingOptions(context_before=0, context_after=0), 99, 64)[0][0]
    # Plain turns by default: no entities; derived ones on request.
    assert "entities" not in m
    derived = MappingOptions(entities=True)
    assert suite.memories("lme-q1", derived, 99, 64)[0][3]["entities"] == ["noted", "level"]
    assert suite.memories("lme-q1", derived, 99, 1)[0][3]["entities"] == ["noted"]


def test_mapping_cuts_to_the_service_limit(suite: LongMemEval) -> None:
    memories, cut = suite.memories("lme-q1", MappingOptions(), 10, 64)
    assert cut == 3  # "I parked on level 2", "Noted: level 2" (and contexts), the "thanks" turn's context
    assert memories[2]["content"] == "I parked o"
    assert all(len(m.get("context", "")) <= 10 for m in memories)


def test_queries_ask_at_the_question_date(suite: LongMemEval) -> None:
    (q1, q2) = suite.queries()
    assert (q1.key, q1.tenant, q1.text, q1.kind) == ("q1", "lme-q1", "Where did I park?", "multi-session")
    assert q1.at == datetime(2023, 5, 30, 3, 16, tzinfo=UTC)
    assert q2.tenant == "lme-q2"


def test_score_question_suggested_and_official(suite: LongMemEval) -> None:
    q = suite.questions[0]
    # Assistant evidence first, a filler user turn, then the user evidence at rank 3.
    ranked = ["lme-q1:1:1", "lme-q1:0:0", "lme-q1:1:0", "other:0:0", "lme-q1:2:0", "lme-q1:1:2"]
    s = score_question(q, ranked)
    assert s["turn any@5"] == 1.0
    assert s["turn all@10"] == 1.0  # both has_answer turns (one is the assistant's)
    assert s["turn ndcg@10"] == pytest.approx((1 + 1 / math.log2(3)) / 2)
    assert s["session any@5"] == 1.0  # answer_a first, f1 second
    # Official: user turns only -> f1_1, answer_a_1, f1_1 (the copy), answer_a_3.
    assert s["official turn any@5"] == 1.0
    assert s["official turn ndcg@5"] == 1.0  # the gold turn at rank 2 counts fully
    # Sessions: f1, answer_a -> two distinct labels only; the cutoff grows past the list.
    assert s["official session any@5"] == 1.0
    # nDCG over the turn labels: answer_a at ranks 2 and 4 of 2 gold-session user turns.
    assert s["official session ndcg@5"] == pytest.approx((1 + 1 / 2) / 2)
    # An empty ranking finds nothing.
    empty = score_question(q, [])
    assert (empty["turn any@10"], empty["turn all@10"], empty["session any@10"]) == (0.0, 0.0, 0.0)


def test_official_session_cutoff_grows_to_k_distinct_sessions(tmp_path: Path) -> None:
    # Four fillers with two user turns each, then the answer session.
    fillers = [[_turn("user", f"f{i} a"), _turn("user", f"f{i} b")] for i in range(4)]
    data = tmp_path / "lme.json"
    data.write_text(
        json.dumps(
            [
                _question(
                    haystack_sessions=[*fillers, [_turn("user", "level 2", True)]],
                    haystack_session_ids=["f0", "f1", "f2", "f3", "answer_a"],
                    haystack_dates=["2023/05/20 (Sat) 15:08"] * 5,
                )
            ]
        )
    )
    (q,) = LongMemEval(data).questions
    # f0, f0, f1, f1, f2, f3, answer_a: the fifth distinct session is the 7th turn.
    ranked = ["lme-q1:0:0", "lme-q1:0:1", "lme-q1:1:0", "lme-q1:1:1", "lme-q1:2:0", "lme-q1:3:0", "lme-q1:4:0"]
    s = score_question(q, ranked)
    assert s["official turn any@5"] == 0.0
    assert s["official session any@5"] == 1.0
    assert s["official session ndcg@5"] == pytest.approx(1 / math.log2(7))
    assert score_question(q, ranked[:6])["official session any@5"] == 0.0
    # The suggested session figure dedupes: answer_a is the fifth session.
    assert s["session any@5"] == 1.0


def test_score_question_without_user_evidence(tmp_path: Path) -> None:
    # Only the assistant turn holds the evidence: the official turn figures are
    # any 0 and all 1 whatever the ranking, as the official code scores them.
    sessions = [[_turn("user", "tell me a fact", False), _turn("assistant", "the fact", True)]]
    data = tmp_path / "lme.json"
    data.write_text(
        json.dumps(
            [
                _question(
                    haystack_sessions=sessions,
                    haystack_session_ids=["answer_a"],
                    haystack_dates=["2023/05/20 (Sat) 15:08"],
                )
            ]
        )
    )
    (q,) = LongMemEval(data).questions
    s = score_question(q, ["lme-q1:0:1", "lme-q1:0:0"])
    assert s["turn all@10"] == 1.0
    assert (s["official turn any@10"], s["official turn all@10"], s["official turn ndcg@10"]) == (0.0, 1.0, 0.0)
    assert (s["official session any@5"], s["official session all@5"]) == (0.0, 1.0)


def test_score_averages_overall_and_per_type(suite: LongMemEval) -> None:
    hit = ["lme-q1:1:0", "lme-q1:1:1"]
    miss = ["lme-q2:0:0"]
    out = suite.score([hit, miss])
    assert out["overall"]["n"] == 2
    assert out["overall"]["turn all@10"] == 0.5
    assert out["by_kind"]["multi-session"]["turn all@10"] == 1.0
    assert out["by_kind"]["knowledge-update"]["turn all@10"] == 0.0
    assert set(out["per_question"]) == {"q1", "q2"}
