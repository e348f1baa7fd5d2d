"""The token-budgeted memory block.

Hand-computed cases use toy encoders (one token per character or per UTF-8
byte) so every count can be read off the text; the sweeps use cl100k_base.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone

import pytest

from fusion import Block, BlockItem, Encoding, format_block, get_encoding

UTC = UTC
DAY = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
# "[Memory: fact | 2024-05-01]\n" + content + "\nconfidence: 0.90" is 45 chars + content.
FIXED = 45


class CharEncoding:
    """One token per character."""

    def encode(self, text: str, /) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, tokens: Sequence[int], /) -> str:
        return "".join(chr(t) for t in tokens)


class ByteEncoding:
    """One token per UTF-8 byte; a cut inside a character decodes to U+FFFD."""

    def encode(self, text: str, /) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, tokens: Sequence[int], /) -> str:
        return bytes(tokens).decode("utf-8", errors="replace")


class JunctionEncoding(CharEncoding):
    """Like CharEncoding, plus an empty token (0) wherever an item follows
    another: the parts' counts then add up to one less than the whole's."""

    def encode(self, text: str, /) -> list[int]:
        tokens: list[int] = []
        for i, c in enumerate(text):
            tokens.append(ord(c))
            if i >= 3 and text.startswith("0\n\n[", i - 3):
                tokens.append(0)
        return tokens

    def decode(self, tokens: Sequence[int], /) -> str:
        return "".join(chr(t) for t in tokens if t)


def item(content: str, *, kind: str = "fact", confidence: float = 0.9) -> BlockItem:
    return BlockItem(kind=kind, created_at=DAY, content=content, confidence=confidence)


def rendered(it: BlockItem, content: str | None = None) -> str:
    body = it.content.strip() if content is None else content
    return f"[Memory: {it.kind} | 2024-05-01]\n{body}\nconfidence: {it.confidence:.2f}"


def test_junction_encoding_counts_one_extra_token_per_junction() -> None:
    enc = JunctionEncoding()
    text = rendered(item("a")) + "\n\n" + rendered(item("b"))
    assert len(enc.encode(text)) == 2 * (FIXED + 1) + 2 + 1
    assert enc.decode(enc.encode(text)) == text


# Rendering -----------------------------------------------------------------


def test_one_item_exact_text_and_tokens() -> None:
    enc = get_encoding("cl100k_base")
    block = format_block([item("  The user prefers dark mode.\n")], 100, enc)
    assert block == Block(
        text="[Memory: fact | 2024-05-01]\nThe user prefers dark mode.\nconfidence: 0.90",
        tokens=25,
        included=[0],
        truncated=[],
    )
    assert block.tokens == len(enc.encode(block.text))


def test_two_items_joined_by_one_blank_line_newlines_kept() -> None:
    enc = get_encoding("cl100k_base")
    second = BlockItem(
        kind="preference",
        created_at=datetime(2023, 12, 31, tzinfo=UTC),
        content="\n line one\nline two \n",
        confidence=0.456,
    )
    block = format_block([item("The user prefers dark mode."), second], 100, enc)
    assert block.text == (
        "[Memory: fact | 2024-05-01]\nThe user prefers dark mode.\nconfidence: 0.90\n\n"
        "[Memory: preference | 2023-12-31]\nline one\nline two\nconfidence: 0.46"
    )
    assert block.tokens == 51 == len(enc.encode(block.text))
    assert (block.included, block.truncated) == ([0, 1], [])


@pytest.mark.parametrize(
    ("created_at", "date"),
    [
        (datetime(2024, 5, 1, 23, 30, tzinfo=timezone(timedelta(hours=-5))), "2024-05-02"),
        (datetime(2024, 5, 1, 3, 0, tzinfo=timezone(timedelta(hours=9))), "2024-04-30"),
        (datetime(2024, 5, 1, 23, 59, 59), "2024-05-01"),  # naive: taken as UTC
        (datetime(999, 1, 2, tzinfo=UTC), "0999-01-02"),
    ],
)
def test_date_is_the_utc_date(created_at: datetime, date: str) -> None:
    it = BlockItem(kind="k", created_at=created_at, content="c", confidence=1.0)
    block = format_block([it], 100, CharEncoding())
    assert block.text == f"[Memory: k | {date}]\nc\nconfidence: 1.00"


@pytest.mark.parametrize(
    ("confidence", "shown"),
    [
        (0.0, "0.00"),
        (1.0, "1.00"),
        (0.5, "0.50"),
        (0.456, "0.46"),
        (0.994, "0.99"),
        (0.996, "1.00"),
    ],
)
def test_confidence_has_two_decimals(confidence: float, shown: str) -> None:
    block = format_block([item("c", confidence=confidence)], 100, CharEncoding())
    assert block.text.endswith(f"\nconfidence: {shown}")


def test_empty_items() -> None:
    assert format_block([], 10, CharEncoding()) == Block("", 0, [], [])


@pytest.mark.parametrize("budget", [0, -1])
def test_budget_below_one_is_refused(budget: int) -> None:
    with pytest.raises(ValueError) as info:
        format_block([item("x")], budget, CharEncoding())
    assert str(info.value) == f"budget_tokens must be >= 1, got {budget}"


def test_min_content_tokens_below_one_is_refused() -> None:
    with pytest.raises(ValueError) as info:
        format_block([item("x")], 10, CharEncoding(), min_content_tokens=0)
    assert str(info.value) == "min_content_tokens must be >= 1, got 0"


# Budgeting, hand-computed with one token per character ---------------------


def test_item_that_fits_exactly_goes_in_whole() -> None:
    block = format_block([item("abcdefghij")], FIXED + 10, CharEncoding())
    assert block == Block(rendered(item("abcdefghij")), FIXED + 10, [0], [])


def test_cut_keeps_min_content_tokens_plus_ellipsis() -> None:
    it = item("abcdefghij")
    block = format_block([it], FIXED + 8 + 1, CharEncoding())
    assert block == Block(rendered(it, "abcdefgh…"), FIXED + 9, [0], [0])


def test_too_small_budget_leaves_the_item_out() -> None:
    assert format_block([item("abcdefghij")], FIXED + 8, CharEncoding()) == Block("", 0, [], [])
    assert format_block([item("abcdefghij")], 1, CharEncoding()) == Block("", 0, [], [])


def test_min_content_tokens_is_honoured() -> None:
    it = item("abcdefghij")
    block = format_block([it], FIXED + 2, CharEncoding(), min_content_tokens=1)
    assert block == Block(rendered(it, "a…"), FIXED + 2, [0], [0])
    block = format_block([it], FIXED + 6, CharEncoding(), min_content_tokens=6)
    assert block == Block("", 0, [], [])


def test_item_too_short_to_cut_is_left_out() -> None:
    # Eight characters: a cut would keep at most seven, below the minimum.
    assert format_block([item("abcdefgh")], FIXED + 7, CharEncoding()) == Block("", 0, [], [])


def test_later_shorter_item_fits_after_a_long_skipped_one() -> None:
    long, short = item("x" * 100), item("ok")
    block = format_block([long, short], 50, CharEncoding())
    assert block == Block(rendered(short), FIXED + 2, [1], [])


def test_nothing_is_added_after_a_cut_item() -> None:
    a, b, c = item("abcdefghij"), item("b" * 100), item("ok")
    budget = (FIXED + 10) + 2 + (FIXED + 8 + 1)
    block = format_block([a, b, c], budget, CharEncoding())
    assert block.text == rendered(a) + "\n\n" + rendered(b, "b" * 8 + "…")
    assert (block.tokens, block.included, block.truncated) == (budget, [0, 1], [1])


def test_skipped_middle_item_then_next_fits() -> None:
    a, b, c = item("abcdefghij"), item("b" * 100), item("ok")
    budget = (FIXED + 10) + 2 + (FIXED + 2)
    block = format_block([a, b, c], budget, CharEncoding())
    assert block == Block(rendered(a) + "\n\n" + rendered(c), budget, [0, 2], [])


def test_content_is_stripped_before_cutting() -> None:
    it = item("   abcdefghij   ")
    block = format_block([it], FIXED + 9, CharEncoding())
    assert block.text == rendered(it, "abcdefgh…")


# Multi-byte characters, one token per byte ----------------------------------


def test_cut_never_splits_a_multibyte_character() -> None:
    it = item("ééééé")  # 10 bytes; "…" is 3 bytes
    block = format_block([it], FIXED + 3 + 3, ByteEncoding(), min_content_tokens=1)
    assert block == Block(rendered(it, "é…"), FIXED + 2 + 3, [0], [0])


def test_backing_off_below_the_minimum_leaves_the_item_out() -> None:
    it = item("ééééé")
    block = format_block([it], FIXED + 3 + 3, ByteEncoding(), min_content_tokens=3)
    assert block == Block("", 0, [], [])


def test_replacement_character_in_the_original_is_kept_whole() -> None:
    it = item("\ufffd" * 4)  # 12 bytes, 3 per character
    block = format_block([it], FIXED + 11, ByteEncoding(), min_content_tokens=1)
    assert block == Block(rendered(it, "\ufffd\ufffd…"), FIXED + 6 + 3, [0], [0])


# Counts that do not add up --------------------------------------------------


def test_budget_holds_when_the_parts_undercount_the_whole() -> None:
    enc = JunctionEncoding()
    a, b = item("abcdefghij"), item("ok")
    whole = rendered(a) + "\n\n" + rendered(b)  # parts: 55 + 2 + 47, whole: 105
    assert format_block([a, b], 2 * FIXED + 15, enc) == Block(whole, 2 * FIXED + 15, [0, 1], [])
    assert format_block([a, b], 2 * FIXED + 14, enc) == Block(rendered(a), FIXED + 10, [0], [])


def test_cut_holds_when_the_parts_undercount_the_whole() -> None:
    enc = JunctionEncoding()
    a, b = item("abcdefghij"), item("b" * 20)
    base = (FIXED + 10) + 2 + FIXED + 1  # a, separator, b's frame with "…"
    assert format_block([a, b], base + 8, enc) == Block(rendered(a), FIXED + 10, [0], [])
    expected = rendered(a) + "\n\n" + rendered(b, "b" * 8 + "…")
    assert format_block([a, b], base + 9, enc) == Block(expected, base + 9, [0, 1], [1])


# Sweeps with the real tokenizer ---------------------------------------------

TEXTS = [
    "The user prefers dark mode and uses a split keyboard with a tented layout at work.",
    "Réunion à Zürich: café, crème brûlée, naïve façade, São Paulo, Øresund, Łódź.",
    "用户喜欢在周末去爬山，并且对花粉过敏。她的猫叫小白，今年三岁了。",
    "🎉🚀 Launch day! 👩‍💻👨‍👩‍👧‍👦 family emoji, flags 🇯🇵🇫🇷, skin tones 👍🏽 and keycaps 1️⃣.",
    "Line one of a note.\n\n  Indented line two with\ttabs.\nLine three: 東京 → Zürich 🚆.",
    "e\u0301 combining acute, a\u0308 umlaut, हिन्दी, العربية, русский текст, ελληνικά.",
    "Literal special-token text <|endoftext|> stays plain text.",
    "x",
]


def sweep_items() -> list[BlockItem]:
    kinds = ["fact", "preference", "episode", "note"]
    return [
        BlockItem(
            kind=kinds[i % len(kinds)],
            created_at=DAY + timedelta(days=37 * i, hours=5 * i),
            content=text * (1 + i % 3),
            confidence=i / len(TEXTS),
        )
        for i, text in enumerate(TEXTS)
    ]


def check_block(block: Block, items: Sequence[BlockItem], budget: int, enc: Encoding) -> None:
    assert block.tokens == len(enc.encode(block.text)) <= budget
    assert block.included == sorted(set(block.included))
    assert set(block.truncated) <= set(block.included)
    assert block.truncated in ([], block.included[-1:])
    pieces = block.text.split("\n\n[Memory: ") if block.text else []
    assert len(pieces) == len(block.included)
    for n, index in enumerate(block.included):
        it = items[index]
        got, expected = ("" if n == 0 else "[Memory: ") + pieces[n], render_any(it)
        if index in block.truncated:
            header, _, rest = got.partition("\n")
            content, _, footer = rest.rpartition("\n")
            assert header == expected.partition("\n")[0]
            assert footer == expected.rpartition("\n")[2]
            assert content.endswith("…")
            cut = content[:-1]
            assert it.content.strip().startswith(cut)
            assert 0 < len(cut) < len(it.content.strip())
            assert "\ufffd" not in cut
        else:
            assert got == expected


def render_any(it: BlockItem) -> str:
    date = it.created_at.astimezone(UTC).date().isoformat()
    return f"[Memory: {it.kind} | {date}]\n{it.content.strip()}\nconfidence: {it.confidence:.2f}"


@pytest.mark.parametrize("min_content", [1, 8])
def test_budget_never_exceeded_sweep(min_content: int) -> None:
    enc = get_encoding("cl100k_base")
    items = sweep_items()
    seen_cut = seen_skip = 0
    for budget in range(1, 401):
        block = format_block(items, budget, enc, min_content_tokens=min_content)
        check_block(block, items, budget, enc)
        seen_cut += bool(block.truncated)
        seen_skip += block.included != list(range(len(block.included)))
    assert seen_cut > 200 and seen_skip > 0


@pytest.mark.parametrize("text", TEXTS)
def test_single_item_sweep(text: str) -> None:
    enc = get_encoding("cl100k_base")
    items = [item(text * 4)]
    full = len(enc.encode(render_any(items[0])))
    for budget in range(1, 401):
        block = format_block(items, budget, enc, min_content_tokens=1)
        check_block(block, items, budget, enc)
        if budget >= full:
            assert block == Block(render_any(items[0]), full, [0], [])
        else:
            assert block.included == block.truncated


def reference_block(items: Sequence[BlockItem], budget: int, min_content: int) -> Block:
    """The rules read literally: every candidate block is encoded whole, and a
    cut tries every token count from the longest down."""
    enc = get_encoding("cl100k_base")
    pieces: list[str] = []
    included: list[int] = []
    for index, it in enumerate(items):
        whole = render_any(it)
        if len(enc.encode("\n\n".join([*pieces, whole]))) <= budget:
            pieces.append(whole)
            included.append(index)
            continue
        header, footer = whole.partition("\n")[0], whole.rpartition("\n")[2]
        content = it.content.strip()
        tokens = enc.encode(content)
        for n in range(len(tokens) - 1, min_content - 1, -1):
            head = enc.decode(tokens[:n])
            text = "\n\n".join([*pieces, f"{header}\n{head}…\n{footer}"])
            if content.startswith(head) and len(enc.encode(text)) <= budget:
                return Block(text, len(enc.encode(text)), [*included, index], [index])
    text = "\n\n".join(pieces)
    return Block(text, len(enc.encode(text)), included, [])


@pytest.mark.parametrize("min_content", [1, 8])
def test_matches_the_literal_reference(min_content: int) -> None:
    enc = get_encoding("cl100k_base")
    cases = [sweep_items(), *([item(text * 4)] for text in TEXTS)]
    for items in cases:
        for budget in range(1, 401, 3):
            got = format_block(items, budget, enc, min_content_tokens=min_content)
            assert got == reference_block(items, budget, min_content)


def test_get_encoding_is_cached_and_plain() -> None:
    enc = get_encoding("cl100k_base")
    assert get_encoding("cl100k_base") is enc
    assert enc.encode("hello world") == [15339, 1917]
    tokens = enc.encode("<|endoftext|>")
    assert len(tokens) == 7 and enc.decode(tokens) == "<|endoftext|>"


class CountedEncoding(CharEncoding):
    """CharEncoding that records every text it encodes."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def encode(self, text: str, /) -> list[int]:
        self.seen.append(text)
        return super().encode(text)


def test_a_pieces_count_is_kept_and_the_whole_block_is_still_measured() -> None:
    enc = CountedEncoding()
    items = [item("first memory"), item("second memory")]
    first = format_block(items, 10_000, enc)
    pieces = first.text.split("\n\n")
    assert enc.seen.count(pieces[0]) == 1 and enc.seen.count(first.text) == 1
    enc.seen.clear()
    again = format_block(items, 10_000, enc)
    assert again == first
    # The pieces' counts were kept; the block itself is encoded every time.
    assert pieces[0] not in enc.seen and pieces[1] not in enc.seen
    assert enc.seen.count(first.text) == 1
    # A piece too long to keep is encoded every time.
    long = [item("x" * 5000)]
    format_block(long, 10_000, enc)
    enc.seen.clear()
    block = format_block(long, 10_000, enc)
    assert enc.seen.count(block.text) == 2, "once as the piece, once as the block"
