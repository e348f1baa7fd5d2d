"""The rank_bm25-exact Okapi BM25 and the reference tokenizers."""

from __future__ import annotations

import math

import pytest

from benchmarks.quality.bm25 import OkapiBM25, space_tokens, word_tokens
from benchmarks.quality.naive import BM25


def approx(value: float) -> object:
    return pytest.approx(value, rel=1e-12, abs=0.0)


def test_tokenizers() -> None:
    assert word_tokens("Caroline's LGBTQ-group, snake_case 7 Mai!") == [
        "caroline",
        "s",
        "lgbtq",
        "group",
        "snake_case",
        "7",
        "mai",
    ]
    assert space_tokens("Where  did I") == ["Where", "", "did", "I"]


# Three docs, lengths 2, 2, 1 (average 5/3). "x" is in two of them: its idf
# ln(3 - 2 + 0.5) - ln(2 + 0.5) is negative and floored at 0.25 x the mean idf
# of the vocabulary in order of first appearance (x, y, z, w).
DOCS = [["x", "y"], ["x", "z"], ["w"]]
RARE = math.log(2.5) - math.log(1.5)
FLOOR = 0.25 * (math.log(1.5) - math.log(2.5) + 3 * RARE) / 4
TF_LEN2 = 2.5 / (1 + 1.5 * (0.25 + 0.75 * 2 / (5 / 3)))
TF_LEN1 = 2.5 / (1 + 1.5 * (0.25 + 0.75 * 1 / (5 / 3)))


def test_scores_by_hand() -> None:
    bm25 = OkapiBM25(DOCS)
    assert list(bm25.scores(["x"])) == [approx(FLOOR * TF_LEN2), approx(FLOOR * TF_LEN2), 0.0]
    assert list(bm25.scores(["x", "y"])) == [approx((FLOOR + RARE) * TF_LEN2), approx(FLOOR * TF_LEN2), 0.0]
    # A repeated query term counts twice; an unknown one adds nothing.
    assert list(bm25.scores(["w", "w", "q"])) == [0.0, 0.0, approx(2 * RARE * TF_LEN1)]
    # The LoCoMo reference is the same formula.
    assert list(bm25.scores(["x", "y", "w"])) == [approx(v) for v in BM25(DOCS).scores(["x", "y", "w"])]


def test_ranking_breaks_ties_by_corpus_order() -> None:
    bm25 = OkapiBM25([["a"], ["b"], ["a"], ["c"], ["b"]])
    assert bm25.ranking(["b"]) == [1, 4, 0, 2, 3]
    assert bm25.ranking(["q"]) == [0, 1, 2, 3, 4]


def test_term_frequency_saturates() -> None:
    bm25 = OkapiBM25([["a", "a", "b"], ["b", "c", "d"], ["e"]])  # avgdl 7/3
    norm = 1.5 * (0.25 + 0.75 * 3 / (7 / 3))
    assert bm25.scores(["a"])[0] == approx(RARE * 2 * 2.5 / (2 + norm))


def test_empty_corpus_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^BM25 needs at least one document$"):
        OkapiBM25([])
