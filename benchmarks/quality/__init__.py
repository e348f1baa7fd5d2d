"""Retrieval quality on LoCoMo, measured through Braid's HTTP API (issue 3).

``python -m benchmarks.quality [--data DIR]`` starts the service on the
embedded stack in a fresh data directory with one agent key per conversation
(each conversation is its own tenant), writes every turn as a ``session``
memory, waits for the Typesense outbox to drain, then asks every question of
categories 1-4 once per source alone and once fused (``top_k`` 20) and scores
evidence recall@5/10/20 and nDCG@10, overall and per category, with recall
latency. Writes ``benchmarks/results/quality.md``, ``.json`` and ``.png`` and
prints one line::

    quality: fused R@10=0.xxx nDCG@10=0.xxx best_single R@10=0.xxx (<source>)

Only the fused recall sends ``track: true`` (the warm-up and the single-source
recalls send ``false``), as an agent runtime makes one recall per question.

``--suite longmemeval [--data FILE.json]`` and ``--suite beam [--data DIR]``
run LongMemEval_S and BEAM 100K the same way (:mod:`benchmarks.quality.suites`),
into ``quality-longmemeval.*`` and ``quality-beam.*``. For every suite,
``--set dotted.key=value`` overrides the service config and ``--sweep
FILE.yaml`` asks the fused recalls again under each override set after one
ingestion (:mod:`benchmarks.quality.tuning`).
"""

from .locomo import Conversation, MappingOptions, Question, conversation_memories, load_conversations
from .metrics import hit_ranks, mean, ndcg_at_k, recall_at_k, recall_curve

__all__ = [
    "Conversation",
    "MappingOptions",
    "Question",
    "conversation_memories",
    "hit_ranks",
    "load_conversations",
    "mean",
    "ndcg_at_k",
    "recall_at_k",
    "recall_curve",
]
