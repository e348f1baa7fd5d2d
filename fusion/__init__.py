"""Pure ranking and formatting: no I/O."""

from fusion.assemble import Assembly, Candidate, Ranked, Ranking, assemble, rank
from fusion.block import Block, BlockItem, format_block
from fusion.factors import (
    FactorWeights,
    Scored,
    apply_factors,
    importance_factor,
    memory_factors,
    order_by_time,
    recency_factor,
    restate,
    restatement_candidates,
    score_factors,
    states_change,
    usage_candidates,
    usage_factor,
    with_usage,
)
from fusion.query import (
    QueryPlan,
    addressed,
    analyze_query,
    asks_current,
    date_ranges,
    other_party,
    relative_ranges,
)
from fusion.rrf import Fused, rrf, rrf_one
from fusion.tokens import Encoding, get_encoding

__all__ = [
    "Assembly",
    "Candidate",
    "Ranked",
    "Ranking",
    "FactorWeights",
    "rank",
    "assemble",
    "Block",
    "BlockItem",
    "Encoding",
    "Fused",
    "QueryPlan",
    "Scored",
    "addressed",
    "analyze_query",
    "asks_current",
    "apply_factors",
    "date_ranges",
    "other_party",
    "relative_ranges",
    "format_block",
    "get_encoding",
    "rrf",
    "rrf_one",
    "score_factors",
    "importance_factor",
    "memory_factors",
    "order_by_time",
    "recency_factor",
    "restate",
    "restatement_candidates",
    "states_change",
    "usage_candidates",
    "usage_factor",
    "with_usage",
]
