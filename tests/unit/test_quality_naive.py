"""The quality benchmark's naive reference (BM25, RRF) and its turn-to-memory mapping."""

from __future__ import annotations

import math

import pytest

from benchmarks.quality.locomo import Conversation, MappingOptions, Question, conversation_memories, turn_entities
from benchmarks.quality.naive import BM25, rrf, summarize, tokenize


def approx(value: float) -> object:
    return pytest.approx(value, rel=1e-12, abs=0.0)


def test_tokenize_lowercases_and_splits_on_non_alphanumerics() -> None:
    assert tokenize("Caroline's LGBTQ-group, 7 May 2023!") == ["caroline", "s", "lgbtq", "group", "7", "may", "2023"]
    assert tokenize(" ?! ") == []


# Three docs, lengths 2, 2, 1 (average 5/3). "x" is in two of them, so its idf
# ln(3 - 2 + 0.5) - ln(2 + 0.5) is negative and floored at 0.25 times the mean
# idf of the vocabulary {w, x, y, z}: (3 ln(2.5/1.5) + ln(1.5/2.5)) / 4.
DOCS = [tokenize("X y"), tokenize("x, Z!"), tokenize("w")]
RARE = math.log(2.5) - math.log(1.5)  # n = 1 of N = 3
FLOOR = 0.25 * (3 * RARE + math.log(1.5) - math.log(2.5)) / 4  # = RARE / 8
# tf part (tf = 1): (k1 + 1) / (1 + k1 (1 - b + b dl/avgdl)), k1 1.5, b 0.75.
TF_LEN2 = 2.5 / (1 + 1.5 * (0.25 + 0.75 * 2 / (5 / 3)))  # 2.5 / 2.725
TF_LEN1 = 2.5 / (1 + 1.5 * (0.25 + 0.75 * 1 / (5 / 3)))  # 2.5 / 2.05


def test_bm25_scores_by_hand() -> None:
    bm25 = BM25(DOCS)
    assert FLOOR == approx(RARE / 8)
    assert list(bm25.scores(["x"])) == [approx(FLOOR * TF_LEN2), approx(FLOOR * TF_LEN2), 0.0]
    assert list(bm25.scores(["x", "y"])) == [approx((FLOOR + RARE) * TF_LEN2), approx(FLOOR * TF_LEN2), 0.0]
    assert list(bm25.scores(["w"])) == [0.0, 0.0, approx(RARE * TF_LEN1)]
    # A repeated query term counts twice; an unknown one adds nothing.
    assert list(bm25.scores(["w", "w", "q"])) == [0.0, 0.0, approx(2 * RARE * TF_LEN1)]
    assert list(bm25.scores([])) == [0.0, 0.0, 0.0]


def test_bm25_term_frequency_saturates() -> None:
    bm25 = BM25([["a", "a", "b"], ["b", "c", "d"], ["e"]])  # lengths 3, 3, 1: avgdl 7/3
    norm = 1.5 * (0.25 + 0.75 * 3 / (7 / 3))
    assert bm25.scores(["a"])[0] == approx(RARE * 2 * 2.5 / (2 + norm))


def test_rrf_sums_reciprocal_ranks_and_keeps_first_seen_order_on_ties() -> None:
    # a: 1/61 + 1/63, b: 1/62 + 1/61, c: 1/63 + 1/62.
    assert rrf([["a", "b", "c"], ["b", "c", "a"]]) == ["b", "a", "c"]
    assert rrf([["a", "b"], ["b", "a"]]) == ["a", "b"]
    assert rrf([["a"], ["b", "a"]], k=1) == ["a", "b"]  # a: 1/2 + 1/3, b: 1/2


def test_summarize_per_category() -> None:
    q1 = Question(0, "?", 1, frozenset({"D1:1", "D1:2"}))
    q4 = Question(1, "?", 4, frozenset({"D1:3"}))
    out = summarize([(q1, ["D1:1"] + [f"X{i}" for i in range(10)] + ["D1:2"]), (q4, [])])
    ndcg = 1 / (1 + 1 / math.log2(3))  # one hit at rank 1 of two relevant
    assert out["by_category"]["1"] == {"questions": 1, "R@5": 0.5, "R@10": 0.5, "R@20": 1.0, "nDCG@10": approx(ndcg)}
    assert out["by_category"]["4"] == {"questions": 1, "R@5": 0.0, "R@10": 0.0, "R@20": 0.0, "nDCG@10": 0.0}
    assert out["overall"]["R@20"] == 0.5
    assert len(out["curve"]) == 20


RAW = {
    "speaker_a": "Ann",
    "speaker_b": "Bob",
    "session_1_date_time": "1:56 pm on 8 May, 2023",
    "session_1": [
        {"speaker": "Ann", "dia_id": "D1:1", "text": "Hi!"},
        {"speaker": "Bob", "dia_id": "D1:2", "text": "Look.", "img_url": ["u"], "blip_caption": "a dog"},
        {"speaker": "Ann", "dia_id": "D1:3", "text": "Cute."},
        {"speaker": "Bob", "dia_id": "D1:4", "text": "Bye."},
    ],
    "session_2_date_time": "9:00 am on 10 May, 2023",
    "session_2": [{"speaker": "Ann", "dia_id": "D2:1", "text": "Back."}],
}
CONV = Conversation("t", RAW, (), (), 0)


def contexts(options: MappingOptions = MappingOptions()) -> dict[str, str | None]:
    return {m["metadata"]["dia_id"]: m.get("context") for m in conversation_memories(CONV, options)}


def test_mapping_context_is_two_before_one_after_within_the_session() -> None:
    assert contexts() == {
        "D1:1": "Bob: Look. [image: a dog]",
        "D1:2": "Ann: Hi!\nAnn: Cute.",
        "D1:3": "Ann: Hi!\nBob: Look. [image: a dog]\nBob: Bye.",
        "D1:4": "Bob: Look. [image: a dog]\nAnn: Cute.",
        "D2:1": None,  # alone in its session: the previous session's turns are not context
    }
    assert contexts(MappingOptions(context_before=1, context_after=0)) == {
        "D1:1": None,
        "D1:2": "Ann: Hi!",
        "D1:3": "Bob: Look. [image: a dog]",
        "D1:4": "Ann: Cute.",
        "D2:1": None,
    }
    assert "context" not in conversation_memories(CONV, MappingOptions(0, 0))[1]


def test_mapping_memory_shape() -> None:
    assert conversation_memories(CONV)[1] == {
        "id": "locomo-t:D1:2",
        "content": "Bob: Look. [image: a dog]",
        "speaker": "Bob",
        "context": "Ann: Hi!\nAnn: Cute.",
        "kind": "turn",
        "tier": "session",
        "session_id": "session_1",
        "created_at": "2023-05-08T13:56:00Z",
        "metadata": {"dia_id": "D1:2", "speaker": "Bob"},
    }
    assert conversation_memories(CONV)[4] == {
        "id": "locomo-t:D2:1",
        "content": "Ann: Back.",
        "speaker": "Ann",
        "kind": "turn",
        "tier": "session",
        "session_id": "session_2",
        "created_at": "2023-05-10T09:00:00Z",
        "metadata": {"dia_id": "D2:1", "speaker": "Ann"},
    }
    # The benchmark's own entities only on request (--derived-entities).
    assert conversation_memories(CONV, MappingOptions(entities=True))[4]["entities"] == ["back"]


def test_mapping_refuses_negative_context() -> None:
    with pytest.raises(ValueError, match=r"^context turns must be >= 0, got -1 before, 1 after$"):
        MappingOptions(context_before=-1)


def test_turn_entities_come_from_text_and_caption_only() -> None:
    turn = {
        "speaker": "Caroline",
        "text": "Caroline, I went hiking with Harry Potter fans near Lake Tahoe, really awesome!",
        "blip_caption": "a photo of mountains",
    }
    assert turn_entities(turn, frozenset({"Caroline", "Melanie"})) == [
        "harry potter",
        "lake tahoe",
        "went",
        "hiking",
        "harry",
        "potter",
        "fans",
        "near",
        "lake",
        "tahoe",
        "photo",
        "mountains",
    ]
    assert "entities" not in conversation_memories(CONV)[0]
