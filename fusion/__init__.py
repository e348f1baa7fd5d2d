"""Pure ranking and formatting: no I/O."""

from fusion.block import Block, BlockItem, format_block
from fusion.rrf import Fused, rrf
from fusion.tokens import Encoding, get_encoding

__all__ = [
    "Block",
    "BlockItem",
    "Encoding",
    "Fused",
    "format_block",
    "get_encoding",
    "rrf",
]
