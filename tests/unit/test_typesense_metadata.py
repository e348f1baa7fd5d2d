"""Metadata containment as Typesense tokens: a document contains a filter
exactly when it has every filter token, as jsonb ``@>`` decides (the cases
are Postgres' own, checked against it in tests/api/test_recall_filters.py)."""

from __future__ import annotations

from typing import Any

import pytest

from indexers.typesense.metadata import document_tokens, filter_tokens, unsupported_path


def contains(document: dict[str, Any], wanted: dict[str, Any]) -> bool:
    return set(filter_tokens(wanted)) <= set(document_tokens(document))


@pytest.mark.parametrize(
    ("document", "wanted", "expected"),
    [
        ({"a": 1, "b": "x"}, {"a": 1}, True),
        ({"a": 1, "b": "x"}, {"a": 1, "b": "x"}, True),
        ({"a": 1}, {"a": 2}, False),
        ({"a": 1}, {"b": 1}, False),
        # Numbers by value, strings by text, no coercion between them.
        ({"a": 1}, {"a": 1.0}, True),
        ({"a": 10}, {"a": 1e1}, True),
        ({"a": 0.1}, {"a": 0.1}, True),
        ({"a": 1}, {"a": "1"}, False),
        ({"a": True}, {"a": 1}, False),
        ({"a": None}, {"a": None}, True),
        ({"a": None}, {"a": False}, False),
        # Nested objects: any subset of keys at every level.
        ({"a": {"b": 1, "c": 2}}, {"a": {"b": 1}}, True),
        ({"a": {"b": 1}}, {"a": {"b": 1, "c": 2}}, False),
        ({"a": {"b": {"c": [1, 2]}}}, {"a": {"b": {"c": [2]}}}, True),
        # Arrays: any subset of elements, in any order, duplicates once.
        ({"a": [1, 2, 3]}, {"a": [3, 1]}, True),
        ({"a": [1, 2, 3]}, {"a": [1, 1]}, True),
        ({"a": [1, 2]}, {"a": [4]}, False),
        # Below the top level an array does not contain a bare scalar, nor the reverse.
        ({"a": [1, 2]}, {"a": 1}, False),
        ({"a": 1}, {"a": [1]}, False),
        # Empty containers ask for the type only.
        ({"a": {"b": 1}}, {"a": {}}, True),
        ({"a": [1]}, {"a": []}, True),
        ({"a": [1]}, {"a": {}}, False),
        ({"a": {}}, {"a": []}, False),
        ({"a": 1}, {"a": {}}, False),
        # A key path is not a value: {"a": {"b": 1}} is not {"a": "b"}.
        ({"a": {"b": 1}}, {"a": "b"}, False),
        # Arrays of objects in the document are fine; the filter names scalars in them.
        ({"a": [{"b": 1}, {"c": 2}]}, {"a": []}, True),
        # Big integers keep every digit (no rounding to 28 digits).
        ({"a": 10**40 + 1}, {"a": 10**40}, False),
        ({"a": 10**40}, {"a": 10**40}, True),
        ({"a": -0.0}, {"a": 0}, True),
        ({}, {}, True),
    ],
)
def test_tokens_decide_containment_as_jsonb_does(
    document: dict[str, Any], wanted: dict[str, Any], expected: bool
) -> None:
    assert contains(document, wanted) is expected


def test_tokens_are_fixed_length_hex_whatever_the_values() -> None:
    tokens = document_tokens({"k`ey, with=odd": ["a`b", {"x": "y" * 5000}]})
    assert len(tokens) == 4  # the array, "a`b" in it, the object in it, its "x"
    assert all(len(t) == 32 and int(t, 16) >= 0 for t in tokens)


def test_a_filter_holds_one_token_per_leaf() -> None:
    assert len(filter_tokens({"a": {"b": 1, "c": [1, 2, 2]}, "d": {}})) == 4
    assert filter_tokens({}) == []


@pytest.mark.parametrize(
    ("wanted", "where"),
    [
        ({"a": [1, "x", None, True]}, None),
        ({"a": {"b": [1]}}, None),
        ({"a": [{"b": 1}]}, "metadata.a[0]"),
        ({"a": {"b": [1, [2]]}}, "metadata.a.b[1]"),
    ],
)
def test_arrays_holding_containers_are_named(wanted: dict[str, Any], where: str | None) -> None:
    assert unsupported_path(wanted) == where
