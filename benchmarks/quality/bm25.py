"""Okapi BM25 as ``rank_bm25.BM25Okapi`` computes it, to the last bit, and the
tokenizers the datasets' reference figures were made with.

The LongMemEval and BEAM READMEs give naive BM25 figures made with
``rank_bm25`` (not installed here). :class:`OkapiBM25` follows its arithmetic
step by step (the same idf floor, the same order of floating-point
operations, the query terms added one after the other), so its scores are
the same numbers and ties fall the same way; ``tests/unit`` checks it on hand
values. (:class:`benchmarks.quality.naive.BM25` is the same formula for the
LoCoMo reference, summed in another order.)
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

__all__ = ["OkapiBM25", "space_tokens", "word_tokens"]

_WORD = re.compile(r"\w+")


def word_tokens(text: str) -> list[str]:
    """Lower-cased ``\\w+`` runs: the READMEs' reference tokenizer."""
    return _WORD.findall(text.lower())


def space_tokens(text: str) -> list[str]:
    """``text.split(" ")``: LongMemEval's official BM25 (case kept, empty tokens too)."""
    return text.split(" ")


class OkapiBM25:
    """BM25 (k1 1.5, b 0.75) with rank_bm25's idf: ``ln(N - n + 0.5) - ln(n + 0.5)``,
    a negative one replaced by ``epsilon`` times the mean idf of the vocabulary
    (taken in order of first appearance, negatives included)."""

    def __init__(self, docs: Sequence[Sequence[str]], k1: float = 1.5, b: float = 0.75, epsilon: float = 0.25) -> None:
        if not docs:
            raise ValueError("BM25 needs at least one document")
        self.k1 = k1
        self.postings: dict[str, dict[int, int]] = {}
        lengths = []
        for row, doc in enumerate(docs):
            lengths.append(len(doc))
            for term in doc:
                counts = self.postings.setdefault(term, {})
                counts[row] = counts.get(row, 0) + 1
        n_docs = len(docs)
        avgdl = sum(lengths) / n_docs
        self.idf: dict[str, float] = {}
        idf_sum = 0.0
        negative = []
        for term, counts in self.postings.items():
            idf = math.log(n_docs - len(counts) + 0.5) - math.log(len(counts) + 0.5)
            self.idf[term] = idf
            idf_sum += idf
            if idf < 0:
                negative.append(term)
        floor = epsilon * (idf_sum / len(self.idf)) if self.idf else 0.0
        for term in negative:
            self.idf[term] = floor
        self._n = n_docs
        self._norm = k1 * (1 - b + b * np.array(lengths) / avgdl)

    def scores(self, query: Sequence[str]) -> np.ndarray:
        """One score per document; a term counts once per occurrence in the query."""
        score = np.zeros(self._n)
        for term in query:
            tf = np.zeros(self._n, dtype=np.int64)
            for row, count in self.postings.get(term, {}).items():
                tf[row] = count
            score += self.idf.get(term, 0.0) * (tf * (self.k1 + 1) / (tf + self._norm))
        return score

    def ranking(self, query: Sequence[str]) -> list[int]:
        """Document positions, best first; ties keep corpus order."""
        return [int(i) for i in np.argsort(-self.scores(query), kind="stable")]
