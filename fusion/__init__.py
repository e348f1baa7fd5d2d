"""Pure ranking and formatting: no I/O."""

from fusion.assemble import Assembly, Candidate, Ranked, assemble
from fusion.block import Block, BlockItem, format_block
from fusion.factors import Scored, apply_factors, score_factors
from fusion.query import QueryPlan, analyze_query, date_ranges
from fusion.rrf import Fused, rrf
from fusion.tokens import Encoding, get_encoding

__all__ = [
    "Assembly",
    "Candidate",
    "Ranked",
    "assemble",
    "Block",
    "BlockItem",
    "Encoding",
    "Fused",
    "QueryPlan",
    "Scored",
    "analyze_query",
    "apply_factors",
    "date_ranges",
    "format_block",
    "get_encoding",
    "rrf",
    "score_factors",
]
