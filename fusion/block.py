"""The token-budgeted memory block handed to an agent.

Each item renders as three lines (more if its content has newlines)::

    [Memory: fact | 2024-05-01]
    The user prefers dark mode.
    confidence: 0.90

and items are joined by one blank line. The token count of the whole text
never exceeds the budget. BPE merges across item boundaries make a sum of
per-piece counts an estimate only, so the assembled text is always measured;
in the rare case the estimate was short, the block is packed again with every
step measured on the real text.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import UTC, datetime

import msgspec

from fusion.tokens import Encoding

__all__ = ["Block", "BlockItem", "format_block"]

_SEP = "\n\n"
_ELLIPSIS = "…"


class BlockItem(msgspec.Struct, frozen=True):
    """One memory to render. A naive ``created_at`` is taken as UTC."""

    kind: str
    created_at: datetime
    content: str
    confidence: float


class Block(msgspec.Struct, frozen=True):
    """The rendered block. ``included`` holds the indices of the input items
    that made it in, in order; ``truncated`` the subset whose content was cut.
    ``tokens`` is the exact token count of ``text``."""

    text: str
    tokens: int
    included: list[int]
    truncated: list[int]


def format_block(
    items: Sequence[BlockItem],
    budget_tokens: int,
    encoding: Encoding,
    *,
    min_content_tokens: int = 8,
) -> Block:
    """Render ``items`` in order into at most ``budget_tokens`` tokens.

    An item that fits whole goes in. One that does not is cut at a token
    boundary (and ends with "…") if at least ``min_content_tokens`` tokens of
    its content fit with its header and confidence line; nothing is added
    after a cut item. Otherwise the item is left out and the next one tried.
    """
    if budget_tokens < 1:
        raise ValueError(f"budget_tokens must be >= 1, got {budget_tokens!r}")
    if min_content_tokens < 1:
        raise ValueError(f"min_content_tokens must be >= 1, got {min_content_tokens!r}")
    block = _Packer(budget_tokens, encoding, min_content_tokens, exact=False).pack(items)
    if block.tokens > budget_tokens:
        block = _Packer(budget_tokens, encoding, min_content_tokens, exact=True).pack(items)
    return block


#: Pieces up to this many characters have their token counts kept (:func:`_count`).
_KEPT_UP_TO = 4096


@functools.lru_cache(maxsize=8192)
def _kept_count(encoding: Encoding, piece: str) -> int:
    return len(encoding.encode(piece))


def _count(encoding: Encoding, piece: str) -> int:
    """``len(encoding.encode(piece))``, kept for short pieces: the same
    memories render the same pieces in recall after recall (an encoding
    that cannot be a key is asked every time)."""
    if len(piece) <= _KEPT_UP_TO:
        try:
            return _kept_count(encoding, piece)  # type: ignore[arg-type]
        except TypeError:  # unhashable
            pass
    return len(encoding.encode(piece))


def _render(item: BlockItem, content: str) -> str:
    moment = item.created_at
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return f"[Memory: {item.kind} | {moment.date().isoformat()}]\n{content}\nconfidence: {item.confidence:.2f}"


class _Packer:
    """One packing pass. With ``exact`` every candidate block is encoded
    whole; otherwise its cost is the sum of the parts' counts."""

    def __init__(self, budget: int, encoding: Encoding, min_content: int, *, exact: bool) -> None:
        self.budget = budget
        self.encoding = encoding
        self.min_content = min_content
        self.exact = exact
        self.sep_tokens = len(encoding.encode(_SEP))
        self.pieces: list[str] = []
        self.used = 0

    def pack(self, items: Sequence[BlockItem]) -> Block:
        included: list[int] = []
        truncated: list[int] = []
        for index, item in enumerate(items):
            content = item.content.strip()
            whole = _render(item, content)
            if self._add(whole, self._cost(whole)):
                included.append(index)
                continue
            cut = self._cut(item, content)
            if cut is not None:
                self._add(*cut)
                included.append(index)
                truncated.append(index)
                break
        text = _SEP.join(self.pieces)
        return Block(text, len(self.encoding.encode(text)), included, truncated)

    def _cost(self, piece: str) -> int:
        """Tokens of the block with ``piece`` appended."""
        if self.exact:
            return len(self.encoding.encode(_SEP.join([*self.pieces, piece])))
        sep = self.sep_tokens if self.pieces else 0
        return self.used + sep + _count(self.encoding, piece)

    def _add(self, piece: str, cost: int) -> bool:
        if cost > self.budget:
            return False
        self.pieces.append(piece)
        self.used = cost
        return True

    def _cut(self, item: BlockItem, content: str) -> tuple[str, int] | None:
        """The item with its content cut to fit, and its cost, or ``None``."""
        tokens = self.encoding.encode(content)
        room = self.budget - self._cost(_render(item, _ELLIPSIS))
        limit = min(max(room, self.min_content), len(tokens) - 1)
        while limit >= self.min_content:
            kept, prefix = _prefix(self.encoding, content, tokens, limit)
            if kept < self.min_content:
                return None
            piece = _render(item, prefix + _ELLIPSIS)
            cost = self._cost(piece)
            if cost <= self.budget:
                return piece, cost
            limit = kept - (cost - self.budget)
        return None


def _prefix(encoding: Encoding, content: str, tokens: list[int], limit: int) -> tuple[int, str]:
    """The decoding of ``tokens[:n]`` for the largest ``n <= limit`` that is a
    prefix of ``content``: a cut inside a multi-byte character decodes to a
    U+FFFD the original does not have there, so such a cut is backed off."""
    for n in range(limit, 0, -1):
        head = encoding.decode(tokens[:n])
        if content.startswith(head):
            return n, head
    return 0, ""
