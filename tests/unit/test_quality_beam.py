"""The BEAM suite: its date parser, the chat-to-memory mapping, skipped questions and the figures."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from benchmarks.quality.locomo import MappingOptions
from benchmarks.quality.suites.beam import Beam, BeamQuestion, parse_beam_date, score_question


def test_parse_beam_date() -> None:
    assert parse_beam_date("March-15-2024") == datetime(2024, 3, 15, tzinfo=UTC)
    assert parse_beam_date("november-05-2023") == datetime(2023, 11, 5, tzinfo=UTC)
    with pytest.raises(ValueError, match=r"^unrecognized BEAM date: 'Smarch-15-2024'$"):
        parse_beam_date("Smarch-15-2024")
    with pytest.raises(ValueError, match=r"^unrecognized BEAM date: '2024-03-15'$"):
        parse_beam_date("2024-03-15")


def _message(i: int, role: str, anchor: str | None = None) -> dict[str, Any]:
    m: dict[str, Any] = {"role": role, "id": i, "content": f"message {i} about budgets"}
    if anchor:
        m["time_anchor"] = anchor
    return m


CHAT = [
    {
        "batch_number": 1,
        "time_anchor": None,
        "turns": [
            [_message(0, "user", "March-15-2024"), _message(1, "assistant")],
            [_message(2, "user"), _message(3, "assistant")],
        ],
    },
    {
        "batch_number": 2,
        "time_anchor": None,
        "turns": [[_message(4, "user", "April-05-2024"), _message(5, "assistant")]],
    },
]
PROBING = {
    "knowledge_update": [
        {"question": "ku ok", "source_chat_ids": {"original_info": [0], "updated_info": [4]}},
        {"question": "ku same", "source_chat_ids": {"original_info": [2], "updated_info": [2]}},
        {"question": "ku empty", "source_chat_ids": {"original_info": [2], "updated_info": []}},
    ],
    "contradiction_resolution": [
        {"question": "cr", "source_chat_ids": {"first_statement": [0], "second_statement": [2, 4]}}
    ],
    "temporal_reasoning": [{"question": "tr", "source_chat_ids": {"first_event": [0], "second_event": [4]}}],
    "information_extraction": [
        {"question": "ie", "source_chat_ids": [2, 3]},
        {"question": "gone", "source_chat_ids": [99]},
    ],
    "multi_session_reasoning": [{"question": "msr", "source_chat_ids": []}],
    "abstention": [{"question": "not asked"}],
}


@pytest.fixture
def suite(tmp_path: Path) -> Beam:
    for n, truncated in (("3", True), ("11", False)):
        folder = tmp_path / "100K" / n
        (folder / "probing_questions").mkdir(parents=True)
        (folder / "chat.json").write_text(json.dumps(CHAT + [CHAT[0]] if truncated else CHAT))
        if truncated:  # preferred over chat.json, as BEAM's own code does
            (folder / "chat_trunecated.json").write_text(json.dumps(CHAT))
        (folder / "probing_questions" / "probing_questions.json").write_text(json.dumps(PROBING))
    return Beam(tmp_path)


def test_chats_load_in_number_order_from_the_truncated_file(suite: Beam) -> None:
    assert suite.tenants() == ["beam-3", "beam-11"]
    assert [c.file for c in suite.chats] == ["chat_trunecated.json", "chat.json"]
    assert [len(c.turns) for c in suite.chats] == [6, 6]


def test_mapping_ids_dates_speakers_sessions(suite: Beam) -> None:
    memories, cut = suite.memories("beam-3", MappingOptions(), 32768, 64)
    assert cut == 0
    assert [m["id"] for m in memories] == [f"beam-3:{i}" for i in range(6)]
    assert [m["created_at"] for m in memories] == [
        "2024-03-15T00:00:00Z",
        "2024-03-15T00:00:01Z",
        "2024-03-15T00:00:02Z",
        "2024-03-15T00:00:03Z",
        "2024-04-05T00:00:00Z",
        "2024-04-05T00:00:01Z",
    ]
    assert [m["speaker"] for m in memories] == ["user", "assistant"] * 3
    assert [m["session_id"] for m in memories] == ["batch-1"] * 4 + ["batch-2"] * 2
    assert memories[2]["context"] == "message 0 about budgets\nmessage 1 about budgets\nmessage 3 about budgets"
    assert memories[4]["context"] == "message 5 about budgets"  # the session's first message
    assert "entities" not in memories[0]  # plain turns by default
    derived, _ = suite.memories("beam-3", MappingOptions(entities=True), 32768, 64)
    assert derived[0]["entities"] == ["message", "budgets"]


def test_questions_asked_a_day_after_the_last_session_and_skips_recorded(suite: Beam) -> None:
    queries = suite.queries()
    assert [q.text for q in queries if q.tenant == "beam-3"] == ["ku ok", "cr", "ie", "tr"]
    assert {q.at for q in queries} == {datetime(2024, 4, 6, tzinfo=UTC)}
    assert suite.describe()["skipped"][:4] == [
        "3/knowledge_update/1: updated_info shares [2] with original_info",
        "3/knowledge_update/2: updated_info is empty",
        "3/information_extraction/1: ids [99] name no message",
        "3/multi_session_reasoning/0: no gold message",
    ]


IDS = {f"t:{i}": i for i in range(20)}


def _q(category: str, **gold: list[int]) -> BeamQuestion:
    return BeamQuestion("1/x/0", category, "?", {k: frozenset(v) for k, v in gold.items()})


def test_knowledge_update_new_above_old_and_pass() -> None:
    ku = _q("knowledge_update", old=[1], new=[2, 3])
    assert score_question(ku, ["t:3", "t:1"], IDS) == {"new_above_old": 1.0, "new@10": 1.0, "pass": 1.0}
    assert score_question(ku, ["t:1", "t:2"], IDS) == {"new_above_old": 0.0, "new@10": 1.0, "pass": 0.0}
    # The new message ranked 11th: above the old one (not returned), but not in the top 10.
    late = [f"t:{i}" for i in (0, 4, 5, 6, 7, 8, 9, 10, 11, 12)] + ["t:2"]
    assert score_question(ku, late, IDS) == {"new_above_old": 1.0, "new@10": 0.0, "pass": 0.0}
    # Neither returned: infinity is not below infinity.
    assert score_question(ku, ["t:5"], IDS) == {"new_above_old": 0.0, "new@10": 0.0, "pass": 0.0}
    # Ids of another tenant are not this chat's messages.
    assert score_question(ku, ["other:2"], IDS)["new@10"] == 0.0


def test_contradiction_both_at_10() -> None:
    cr = _q("contradiction_resolution", first=[1], second=[2, 3])
    assert score_question(cr, ["t:3", "t:0", "t:1"], IDS) == {"both@10": 1.0}
    assert score_question(cr, ["t:3", "t:2"], IDS) == {"both@10": 0.0}
    # The first statement 11th: out of the top 10.
    late = [f"t:{i}" for i in (2, 0, 4, 5, 6, 7, 8, 9, 10, 11)] + ["t:1"]
    assert score_question(cr, late, IDS) == {"both@10": 0.0}
    assert score_question(cr, late[:9] + late[10:], IDS) == {"both@10": 1.0}
    # The second statement 11th.
    late = [f"t:{i}" for i in (1, 0, 4, 5, 6, 7, 8, 9, 10, 11, 3)]
    assert score_question(cr, late, IDS) == {"both@10": 0.0}
    same = _q("contradiction_resolution", first=[4], second=[4])
    assert score_question(same, ["t:4"], IDS) == {"both@10": 1.0}


def test_any_and_all_at_10() -> None:
    q = _q("multi_session_reasoning", gold=[1, 2])
    assert score_question(q, ["t:2", "t:5"], IDS) == {"any@10": 1.0, "all@10": 0.0}
    assert score_question(q, ["t:2", "t:1"], IDS) == {"any@10": 1.0, "all@10": 1.0}
    assert score_question(q, [], IDS) == {"any@10": 0.0, "all@10": 0.0}


def test_score_summary(suite: Beam) -> None:
    rankings = [[f"{q.tenant}:4", f"{q.tenant}:0", f"{q.tenant}:2"] for q in suite.queries()]
    out = suite.score(rankings)
    assert out["overall"] == {"ku_pass": 1.0, "new_above_old": 1.0, "new@10": 1.0, "contradiction_both@10": 1.0}
    assert out["by_kind"]["information_extraction"] == {"n": 2, "any@10": 1.0, "all@10": 0.0}
    assert out["by_kind"]["multi_session_reasoning"]["n"] == 0
