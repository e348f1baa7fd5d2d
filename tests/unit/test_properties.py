"""Property tests (hypothesis, derandomized): RRF against its formula, the
memory block's token budget for any text and any budget, and filter values
that try to break out of their quoting, in Typesense and in Postgres.

Every oracle here is written from the documented contract, not from the code:
exact rational arithmetic for the RRF scores, a re-count with the same
tokenizer for the budget, and a small scanner of ``filter_by`` strings that
separates the filter's shape from the values it quotes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from fractions import Fraction
from itertools import pairwise
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from config import load_config
from config.schema import NAME_PATTERN
from fusion import Block, BlockItem, Encoding, format_block, get_encoding, rrf, rrf_one
from indexers.base import Filters
from indexers.postgres import filter_clause
from indexers.typesense import build_filter, narrow_filter
from indexers.typesense.documents import tenant_key
from service.schemas import FREE_LABEL_PATTERN, ID_PATTERN, MemoriesIn, RecallIn
from service.validate import recall_options

#: Derandomized: the same examples on every run, so a failure reproduces.
PROPS = settings(
    derandomize=True,
    deadline=None,
    max_examples=300,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    database=None,
)

UTC = UTC
CONFIG = load_config()

# --- RRF ---------------------------------------------------------------------

SOURCES = ["typesense", "pgvector", "graph", "keyword", "vector"]
#: A small id alphabet, so lists overlap and ids repeat within a list.
ids = st.text(alphabet="abcde-", min_size=1, max_size=3)
rankings = st.dictionaries(st.sampled_from(SOURCES), st.lists(ids, max_size=25), max_size=5)
weight = st.one_of(st.just(0.0), st.just(1.0), st.floats(0.0, 10.0, allow_nan=False))
weights = st.one_of(st.none(), st.dictionaries(st.sampled_from(SOURCES), weight, max_size=5))
ks = st.one_of(st.just(60), st.integers(1, 1000))


def first_ranks(rankings: dict[str, list[str]]) -> dict[str, dict[str, int]]:
    """id -> source -> 1-based position of the id's first appearance."""
    out: dict[str, dict[str, int]] = {}
    for source, listed in rankings.items():
        for position in range(len(listed), 0, -1):  # last write wins = first position
            out.setdefault(listed[position - 1], {})[source] = position
    return out


def exact_scores(rankings: dict[str, list[str]], k: int, weights: dict[str, float] | None) -> dict[str, Fraction]:
    """sum over sources of w_s / (k + rank_s), in exact rational arithmetic."""
    w = weights or {}
    return {
        id_: sum((Fraction(w.get(s, 1.0)) / (k + r) for s, r in by_source.items()), Fraction(0))
        for id_, by_source in first_ranks(rankings).items()
    }


@PROPS
@given(rankings, ks, weights)
def test_rrf_scores_are_the_formula(rankings: dict[str, list[str]], k: int, weights: dict[str, float] | None) -> None:
    fused = rrf(rankings, k=k, weights=weights)
    expected_ranks = first_ranks(rankings)
    exact = exact_scores(rankings, k, weights)
    # No id invented, none dropped, none twice.
    assert sorted(f.id for f in fused) == sorted(expected_ranks)
    w = weights or {}
    for f in fused:
        assert f.ranks == expected_ranks[f.id]
        assert f.contributions == {s: w.get(s, 1.0) / (k + r) for s, r in f.ranks.items()}
        # The score is the correctly rounded sum of the float contributions...
        assert f.score == float(sum(map(Fraction, f.contributions.values()), Fraction(0)))
        # ...and within rounding of the formula computed exactly.
        assert math.isclose(f.score, float(exact[f.id]), rel_tol=1e-12, abs_tol=0.0)


@PROPS
@given(st.lists(ids, max_size=25), ks, weight, st.none() | st.integers(1, 30))
def test_rrf_of_one_list_is_rrf(listed: list[str], k: int, w: float, limit: int | None) -> None:
    """rrf_one gives what rrf gives for that one list: ids, order and scores to the bit."""
    fused = rrf({"keyword": listed}, k=k, weights={"keyword": w})
    assert rrf_one(listed, k=k, weight=w, limit=limit) == [(f.id, f.score) for f in fused][:limit]


@PROPS
@given(rankings, ks, weights)
def test_rrf_order_is_score_then_best_rank_then_id(
    rankings: dict[str, list[str]], k: int, weights: dict[str, float] | None
) -> None:
    fused = rrf(rankings, k=k, weights=weights)
    keys = [(-f.score, min(f.ranks.values()), f.id) for f in fused]
    # Strictly increasing: ids are unique, so the tie-break is total.
    assert all(a < b for a, b in pairwise(keys))


@PROPS
@given(rankings, ks, weights, st.randoms(use_true_random=False))
def test_rrf_does_not_depend_on_the_order_of_the_sources(
    rankings: dict[str, list[str]], k: int, weights: dict[str, float] | None, rnd: Any
) -> None:
    items = list(rankings.items())
    rnd.shuffle(items)
    w_items = list((weights or {}).items())
    rnd.shuffle(w_items)
    assert rrf(dict(items), k=k, weights=dict(w_items)) == rrf(rankings, k=k, weights=weights)


@PROPS
@given(rankings, ks, weights)
def test_rrf_doubling_every_weight_doubles_every_score(
    rankings: dict[str, list[str]], k: int, weights: dict[str, float] | None
) -> None:
    base = rrf(rankings, k=k, weights=weights)
    doubled = {s: 2.0 * (weights or {}).get(s, 1.0) for s in SOURCES}
    scaled = rrf(rankings, k=k, weights=doubled)
    # Multiplying by 2 is exact in binary floating point: same order, scores x2.
    assert [f.id for f in scaled] == [f.id for f in base]
    assert [f.score for f in scaled] == [2.0 * f.score for f in base]


@PROPS
@given(rankings, ks)
def test_rrf_zero_weights_keep_ranks_and_order_by_best_rank(rankings: dict[str, list[str]], k: int) -> None:
    fused = rrf(rankings, k=k, weights=dict.fromkeys(SOURCES, 0.0))
    assert all(f.score == 0.0 and set(f.contributions.values()) <= {0.0} for f in fused)
    assert fused == sorted(fused, key=lambda f: (min(f.ranks.values()), f.id))
    assert {f.id: f.ranks for f in fused} == first_ranks(rankings)


@PROPS
@given(
    rankings,
    ks,
    st.sampled_from(SOURCES),
    st.one_of(st.floats(max_value=-1e-300), st.just(math.inf), st.just(math.nan)),
)
def test_rrf_refuses_negative_or_non_finite_weights(
    rankings: dict[str, list[str]], k: int, source: str, bad: float
) -> None:
    with pytest.raises(ValueError) as err:
        rrf(rankings, k=k, weights={source: bad})
    assert str(err.value) == f"weight of source {source!r} must be finite and >= 0, got {bad!r}"


# --- The token budget -----------------------------------------------------------


class ByteEncoding:
    """One token per UTF-8 byte: a cut can fall inside a character."""

    def encode(self, text: str, /) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, tokens: Sequence[int], /) -> str:
        return bytes(tokens).decode("utf-8", errors="replace")


class JunctionEncoding:
    """One token per character plus an empty token wherever an item follows
    another, so the parts' counts fall short of the whole's (the case the
    packer measures the assembled text for)."""

    def encode(self, text: str, /) -> list[int]:
        tokens = [ord(c) + 1 for c in text]
        for at in reversed([m.start() for m in re.finditer(r"\n\n\[", text)]):
            tokens.insert(at + 3, 0)
        return tokens

    def decode(self, tokens: Sequence[int], /) -> str:
        return "".join(chr(t - 1) for t in tokens if t)


ENC = get_encoding("cl100k_base")
ENCODINGS = pytest.mark.parametrize(
    "enc", [ENC, ByteEncoding(), JunctionEncoding()], ids=["cl100k_base", "bytes", "junction"]
)
SEP = "\n\n"
ELLIPSIS = "…"

#: Emoji with joiners and modifiers, combining marks, RTL, the replacement
#: character, special-token text and whitespace that str.strip() removes.
ODD = list("🎉🚀👩‍💻👨‍👩‍👧‍👦🇯🇵👍🏽1️⃣é\u0301a\u0308\u200d\u202e\ufffd東京العربية\t\r\x0b\x0c\x1c\x85\u2028 ") + [
    "<|endoftext|>",
    "\n\n[Memory: fact | 2024-05-01]\n",
    "confidence: 1.00",
]
contents = st.one_of(
    st.text(max_size=400),  # any code point but surrogates, control characters included
    st.lists(st.sampled_from(ODD), max_size=60).map("".join),
    # one very long word, of one character or a short cycle of them
    st.builds(lambda part, n: (part * n)[:3000], st.text(min_size=1, max_size=3), st.integers(50, 3000)),
    st.lists(st.text(alphabet="abcdefghij ,.\n", max_size=80), max_size=8).map(" ".join),
)
block_items = st.builds(
    BlockItem,
    kind=st.from_regex(r"[A-Za-z0-9_.:\-]{1,16}", fullmatch=True),
    created_at=st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2999, 12, 30), timezones=st.just(UTC)),
    content=contents,
    confidence=st.floats(0.0, 1.0),
)
budgets = st.one_of(st.integers(1, 64), st.integers(1, 2000), st.integers(2000, 65536))


def render(item: BlockItem, content: str) -> str:
    day = item.created_at.astimezone(UTC).date().isoformat()
    return f"[Memory: {item.kind} | {day}]\n{content}\nconfidence: {item.confidence:.2f}"


def token_prefix_length(enc: Encoding, content: str, cut: str, floor: int) -> int | None:
    """The ``n >= floor`` with ``decode(encode(content)[:n]) == cut``, if any.

    Decoded prefixes grow with ``n`` (give or take a replacement character),
    so a bisection finds where to look and a short scan settles it."""
    tokens = enc.encode(content)
    lo, hi = floor, len(tokens) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if len(enc.decode(tokens[:mid])) < len(cut) - 2:
            lo = mid + 1
        else:
            hi = mid
    for n in range(max(floor, lo - 2), len(tokens)):
        head = enc.decode(tokens[:n])
        if head == cut:
            return n
        if len(head) > len(cut) + 2:
            return None
    return None


def check_block(block: Block, items: Sequence[BlockItem], budget: int, min_content: int, enc: Encoding = ENC) -> None:
    # The count is the real count of the text, and within the budget.
    assert block.tokens == len(enc.encode(block.text))
    assert block.tokens <= budget
    assert block.included == sorted(set(block.included))
    assert all(0 <= i < len(items) for i in block.included)
    # At most one item is cut, and nothing follows it.
    assert block.truncated in ([], block.included[-1:])
    whole = [render(items[i], items[i].content.strip()) for i in block.included if i not in block.truncated]
    head = SEP.join(whole)
    if not block.truncated:
        assert block.text == head
        return
    (cut_index,) = block.truncated
    item = items[cut_index]
    content = item.content.strip()
    assert block.text.startswith(head + (SEP if whole else ""))
    last = block.text[len(head) + (len(SEP) if whole else 0) :]
    header = f"[Memory: {item.kind} | {item.created_at.astimezone(UTC).date().isoformat()}]\n"
    footer = f"\nconfidence: {item.confidence:.2f}"
    assert last.startswith(header) and last.endswith(ELLIPSIS + footer)
    cut = last[len(header) : -len(ELLIPSIS + footer)]
    # Cut at a token boundary, keeping at least min_content tokens, never all.
    assert content.startswith(cut) and len(cut) < len(content)
    assert token_prefix_length(enc, content, cut, min_content) is not None, (content, cut)


@ENCODINGS
@PROPS
@given(items=st.lists(block_items, max_size=6), budget=budgets, min_content=st.integers(1, 16))
@example(
    items=[BlockItem("x", datetime(2024, 5, 1, tzinfo=UTC), "🎉" * 500, 0.5)],
    budget=20,
    min_content=1,
)
@example(
    items=[BlockItem("x", datetime(2024, 5, 1, tzinfo=UTC), "<|endoftext|>" * 50, 0.5)],
    budget=30,
    min_content=8,
)
def test_block_never_exceeds_the_budget(enc: Encoding, items: list[BlockItem], budget: int, min_content: int) -> None:
    block = format_block(items, budget, enc, min_content_tokens=min_content)
    check_block(block, items, budget, min_content, enc)
    event("an item cut" if block.truncated else "all whole" if len(block.included) == len(items) else "some left out")


@ENCODINGS
@PROPS
@given(items=st.lists(block_items, min_size=1, max_size=6), slack=st.integers(0, 50))
def test_block_with_room_for_everything_holds_everything_whole(
    enc: Encoding, items: list[BlockItem], slack: int
) -> None:
    renders = [render(it, it.content.strip()) for it in items]
    text = SEP.join(renders)
    exact = len(enc.encode(text))
    # The packer estimates by the parts' counts; room for both the estimate
    # and the real count is room for everything.
    estimate = sum(len(enc.encode(r)) for r in renders) + (len(renders) - 1) * len(enc.encode(SEP))
    block = format_block(items, max(exact, estimate) + slack, enc)
    assert block == Block(text, exact, list(range(len(items))), [])


@PROPS
@given(block_items, st.integers(1, 400), st.integers(1, 16))
def test_single_item_is_whole_cut_or_left_out(item: BlockItem, budget: int, min_content: int) -> None:
    block = format_block([item], budget, ENC, min_content_tokens=min_content)
    check_block(block, [item], budget, min_content)
    whole = render(item, item.content.strip())
    if len(ENC.encode(whole)) <= budget:
        assert block == Block(whole, len(ENC.encode(whole)), [0], [])
    elif block.included:
        assert block.truncated == [0]
    else:
        # Left out only when even min_content tokens of it do not fit.
        tokens = ENC.encode(item.content.strip())
        if len(tokens) > min_content:
            shortest = render(item, ENC.decode(tokens[:min_content]) + ELLIPSIS)
            assert len(ENC.encode(shortest)) > budget or not item.content.strip().startswith(
                ENC.decode(tokens[:min_content])
            )


# --- Filters -------------------------------------------------------------------

#: Values that try Typesense filter_by syntax or SQL quoting, none with a backtick.
HOSTILE = [
    "a && tenant:!=x",
    "x || tenant:=tenant-b",
    "x:=y",
    "tenant:=[tenant-a,tenant-b]",
    "x] || id:=[*",
    "' OR 1=1 --",
    '"; DROP TABLE memories; --',
    "x) OR (1=1",
    "%(f_min_conf)s",
    "%s",
    "$1",
    "tenant-b",
    "*",
    "%",
    "\\",
    "x\\",
    "a,b",
    "\u202e",
    "🎉",
    "\n",
    "\x00",
]
#: Characters worth mixing in: filter syntax, SQL syntax, and the backtick.
SYNTAX = "`&|:=!<>[](),'\";-%\\* \n\x00_ab"
hostile_text = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(alphabet=SYNTAX, min_size=1, max_size=20),
    st.text(min_size=1, max_size=40),
)
tenants = st.from_regex(NAME_PATTERN.rstrip("$") + r"\Z", fullmatch=True)
tier_sets = st.one_of(st.none(), st.lists(st.sampled_from(list(CONFIG.tiers)), min_size=1, unique=True))
stamps = st.one_of(
    st.none(),
    st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2999, 1, 1), timezones=st.just(UTC)),
)
FREE_LABEL = f"Expected `str` matching regex {FREE_LABEL_PATTERN!r}"
LABEL = f"Expected `str` matching regex {ID_PATTERN!r}"


def scan(filter_by: str) -> tuple[str, list[str]]:
    """The filter's shape (each backticked value replaced by ``V``) and the
    values, in order. Raises if a backtick is left open."""
    shape: list[str] = []
    values: list[str] = []
    i = 0
    while i < len(filter_by):
        if filter_by[i] == "`":
            end = filter_by.index("`", i + 1)
            values.append(filter_by[i + 1 : end])
            shape.append("V")
            i = end + 1
        else:
            shape.append(filter_by[i])
            i += 1
    return "".join(shape), values


def expected_shape(tenant: str, filters: Filters, tiers: Sequence[str] | None) -> str:
    def many(n: int) -> str:
        return "[" + ",".join(["V"] * n) + "]"

    # A recall without as_of: the tenant's current documents, by its key.
    parts = [f"current_key:={tenant_key(tenant)}"]
    if tiers is not None:
        parts.append(f"tier:={many(len(tiers))}")
    if filters.kinds:
        parts.append(f"kind:={many(len(filters.kinds))}")
    if filters.tags:
        parts.append(f"tags:={many(len(filters.tags))}")
    if filters.session_id is not None:
        parts.append("session_id:=V")
    if filters.created_after is not None:
        parts.append(f"created_at:>={math.floor(filters.created_after.timestamp())}")
    if filters.created_before is not None:
        parts.append(f"created_at:<={math.floor(filters.created_before.timestamp())}")
    return " && ".join(parts)


def recall_body(draw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"query": "what is the password"}
    if draw(st.booleans()):
        body["tags"] = draw(st.lists(hostile_text, min_size=1, max_size=4))
    if draw(st.booleans()):
        body["kinds"] = draw(st.lists(hostile_text, min_size=1, max_size=4))
    if draw(st.booleans()):
        body["session_id"] = draw(hostile_text)
    tiers = draw(tier_sets)
    if tiers is not None:
        body["tiers"] = tiers
    for field in ("created_after", "created_before"):
        stamp = draw(stamps)
        if stamp is not None:
            body[field] = stamp.isoformat()
    if "created_after" in body and "created_before" in body and body["created_after"] > body["created_before"]:
        body["created_after"], body["created_before"] = (
            body["created_before"],
            body["created_after"],
        )
    body["min_confidence"] = draw(st.floats(0.0, 1.0))
    return body


def free_ok(value: str) -> bool:
    """The FreeLabel contract: no backtick (Typesense quoting), no NUL (Postgres text)."""
    return "`" not in value and "\x00" not in value


def label_ok(value: str) -> bool:
    """The Label contract as meant: only these characters, 1 to 64 of them."""
    return re.fullmatch(r"[A-Za-z0-9_.:\-]{1,64}", value) is not None


@PROPS
@given(st.data())
def test_recall_filters_are_refused_or_quoted_whole(data: st.DataObject) -> None:
    """Whatever the HTTP layer accepts becomes a filter_by of a fixed shape:
    the tenant clause (its key) first, every value whole inside its own backticks."""
    body = recall_body(data.draw)
    tenant = data.draw(tenants)
    tags, kinds, session = body.get("tags", []), body.get("kinds", []), body.get("session_id")
    try:
        decoded = msgspec.json.decode(msgspec.json.encode(body), type=RecallIn)
    except msgspec.ValidationError as exc:
        # Refused: some value carries a backtick (tags, session id) or is not a Label (kinds).
        first_bad = [f"$.tags[{i}]" for i, t in enumerate(tags) if not free_ok(t)]
        first_bad += [f"$.kinds[{i}]" for i, k in enumerate(kinds) if not label_ok(k)]
        first_bad += ["$.session_id"] if session is not None and not free_ok(session) else []
        event("refused by the HTTP layer")
        assert first_bad, f"refused for no reason: {exc}"
        message = str(exc)
        assert message.startswith((f"{FREE_LABEL} - at ", f"{LABEL} - at "))
        assert message.split(" - at ")[1].strip("`") in first_bad
        return
    assert all(free_ok(v) for v in [*tags, *([session] if session else [])])
    assert all(label_ok(k) for k in kinds)
    opts = recall_options(decoded, CONFIG)
    filters = opts.filters
    tiers = [t for t in CONFIG.memory_tiers if filters.tiers is None or t in filters.tiers] or None
    if tiers is None:
        event("entity tier only")
        return  # only the entity tier asked for: Typesense is not searched
    event("accepted, with values" if filters.tags or filters.kinds or filters.session_id else "accepted")
    floor = f" && confidence:>={float(opts.min_confidence or 0.0)!r}"
    for filter_by, tier_list, tail in (
        (build_filter(tenant, filters, opts.min_confidence or 0.0, tiers), tiers, floor),
        (narrow_filter(tenant, filters, tiers), tiers, ""),
        (narrow_filter(tenant, filters), None, ""),
    ):
        key = tenant_key(tenant)
        assert filter_by.startswith(f"current_key:={key} && ") or filter_by == f"current_key:={key}"
        shape, values = scan(filter_by)
        assert shape == expected_shape(tenant, filters, tier_list) + tail
        assert values == [
            *(tier_list or []),
            *(filters.kinds or []),
            *(filters.tags or []),
            *([filters.session_id] if filters.session_id is not None else []),
        ]


@PROPS
@given(tenants, hostile_text, st.sampled_from(["tags", "kinds", "session_id", "tenant"]))
def test_a_value_with_a_backtick_raises(tenant: str, value: str, field: str) -> None:
    """Defence in depth below the HTTP layer: a backtick cannot be escaped in
    Typesense, so a value holding one is never put in a filter."""
    value = value[: len(value) // 2] + "`" + value[len(value) // 2 :]
    filters = Filters(
        tags=(value,) if field == "tags" else ("ok",),
        kinds=(value,) if field == "kinds" else ("note",),
        session_id=value if field == "session_id" else "s",
    )
    for call in (
        lambda: narrow_filter(value if field == "tenant" else tenant, filters),
        lambda: build_filter(value if field == "tenant" else tenant, filters, 0.0, ["session"]),
    ):
        with pytest.raises(ValueError) as err:
            call()
        if field == "tenant":  # a name Braid refuses has no key
            assert str(err.value) == f"invalid tenant name {value!r}"
        else:
            assert str(err.value) == f"filter value {value!r} contains a backtick"


@PROPS
@given(st.lists(hostile_text, min_size=1, max_size=3), hostile_text, st.integers(0, 2))
def test_http_layer_refuses_backticks_in_tags_and_session_id(tags: list[str], session: str, poisoned: int) -> None:
    tags = [t.replace("`", "").replace("\x00", "") or "t" for t in tags]
    session = session.replace("`", "").replace("\x00", "") or "s"
    if poisoned < 2:
        tags[-1] = tags[-1] + "`"
    else:
        session = "`" + session
    body = {"query": "x", "tags": tags, "session_id": session}
    where = f"$.tags[{len(tags) - 1}]" if poisoned < 2 else "$.session_id"
    with pytest.raises(msgspec.ValidationError) as err:
        msgspec.json.decode(msgspec.json.encode(body), type=RecallIn)
    assert str(err.value) == f"{FREE_LABEL} - at `{where}`"
    # The same values are refused on the write path.
    memory = {"content": "x", "tags": tags, "session_id": session}
    with pytest.raises(msgspec.ValidationError) as err:
        msgspec.json.decode(msgspec.json.encode({"memories": [memory]}), type=MemoriesIn)
    assert str(err.value) == f"{FREE_LABEL} - at `$.memories[0].{where[2:]}`"


@PROPS
@given(hostile_text)
def test_http_layer_accepts_ids_and_kinds_only_of_label_characters(value: str) -> None:
    """Memory ids and kinds: ``[A-Za-z0-9_.:-]`` only; everything that could
    be filter or SQL syntax beyond ``:`` and ``-`` is refused."""
    body = {"memories": [{"content": "x", "id": value[:128], "kind": "note"}]}
    value = value[:128]
    try:
        msgspec.json.decode(msgspec.json.encode(body), type=MemoriesIn)
    except msgspec.ValidationError as exc:
        assert re.fullmatch(r"[A-Za-z0-9_.:\-]+", value) is None
        assert str(exc) == f"{LABEL} - at `$.memories[0].id`"
    else:
        assert re.fullmatch(r"[A-Za-z0-9_.:\-]+", value) is not None
    kinds = {"query": "x", "kinds": [value[:64]]}
    try:
        msgspec.json.decode(msgspec.json.encode(kinds), type=RecallIn)
    except msgspec.ValidationError as exc:
        assert not label_ok(value[:64])
        assert str(exc) == f"{LABEL} - at `$.kinds[0]`"
    else:
        assert label_ok(value[:64])


@pytest.mark.parametrize("where", ["id", "kind"])
def test_trailing_newline_is_refused(where: str) -> None:
    body = {"memories": [{"content": "x", where: "abc\n"}]}
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(msgspec.json.encode(body), type=MemoriesIn)


def neutral(filters: Filters) -> Filters:
    """The same filter shape with harmless values."""
    return msgspec.structs.replace(
        filters,
        tags=None if filters.tags is None else tuple(f"t{i}" for i in range(len(filters.tags))),
        kinds=None if filters.kinds is None else tuple(f"k{i}" for i in range(len(filters.kinds))),
        session_id=None if filters.session_id is None else "s",
    )


@PROPS
@given(st.data())
def test_postgres_filter_values_travel_only_as_parameters(data: st.DataObject) -> None:
    body = recall_body(data.draw)
    try:
        decoded = msgspec.json.decode(msgspec.json.encode(body), type=RecallIn)
    except msgspec.ValidationError:
        return  # refused before any SQL (covered above)
    opts = recall_options(decoded, CONFIG)
    filters = opts.filters
    min_conf = opts.min_confidence or 0.0
    for tier in (None, *CONFIG.memory_tiers):
        sql, params = filter_clause(filters, min_confidence=min_conf, memory_tiers=CONFIG.memory_tiers, tier=tier)
        fixed, _ = filter_clause(neutral(filters), min_confidence=0.5, memory_tiers=CONFIG.memory_tiers, tier=tier)
        # The SQL text depends on which filters are set, never on their values.
        assert sql == fixed
        for value in [
            *(filters.tags or ()),
            *(filters.kinds or ()),
            *([filters.session_id] if filters.session_id else []),
        ]:
            assert value not in sql or value in fixed
        assert set(re.findall(r"%\((\w+)\)s", sql)) == set(params)
        assert params.get("f_tags") == (list(filters.tags) if filters.tags else None)
        assert params.get("f_kinds") == (list(filters.kinds) if filters.kinds else None)
        assert params.get("f_session") == filters.session_id
        assert params["f_min_conf"] == min_conf


@PROPS
@given(hostile_text)
def test_postgres_tier_literal_must_be_a_safe_name(tier: str) -> None:
    """A tier goes into the SQL text as a literal, so only configured-name
    shapes pass; anything else raises before any SQL exists."""
    if re.fullmatch(NAME_PATTERN.rstrip("$"), tier.removesuffix("\n")):
        return
    with pytest.raises(ValueError) as err:
        filter_clause(Filters(), min_confidence=0.0, memory_tiers=["session"], tier=tier)
    assert str(err.value) == f"invalid tier name {tier!r}"


def test_known_hostile_values_stay_inside_their_backticks() -> None:
    """The listed values, by name: each sits whole in its own backticks and
    the tenant clause (its key) comes first and is the only tenant clause."""
    key = tenant_key("tenant-a")
    for value in HOSTILE:
        filters = Filters(tags=(value, "ok"), session_id=value)
        filter_by = build_filter("tenant-a", filters, 0.25, ["session"])
        shape, values = scan(filter_by)
        assert shape == f"current_key:={key} && tier:=[V] && tags:=[V,V] && session_id:=V && confidence:>=0.25"
        assert values == ["session", value, "ok", value]
        assert filter_by.startswith(f"current_key:={key} && ") and filter_by.count("_key:=") == 1
