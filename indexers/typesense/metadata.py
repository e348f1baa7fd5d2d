"""Metadata containment in Typesense: a memory's metadata as tokens, a filter as tokens.

Postgres answers ``metadata @> filter`` (jsonb containment); Typesense 0.24.1
has no JSON type. Each document carries ``meta``, a ``string[]`` of tokens, one
for every node of its metadata: the node's path (object keys, ``[]`` for a
step into an array) with its value (a scalar; ``{}`` or ``[]`` for an object
or array). A filter becomes the tokens of its leaves (scalars and empty
containers), and ``meta:=`token`` per token, joined by ``&&``, keeps exactly the
documents whose metadata contains the filter. That equivalence holds as long
as no array in the filter holds an object or an array: ``{"a": [{"b": 1, "c": 2}]}``
asks for one element holding both, which paths cannot say, so such a filter
is refused (:func:`unsupported_path`) by every source alike.

Why tokens and not "ids Postgres says match": the Typesense source then
stays one multi_search with no Postgres round trip, and a filter matching
thousands of memories costs a filter clause, not a list of thousands of ids.

Numbers compare as numbers (``1``, ``1.0`` and ``1e0`` are one value, as in
jsonb), strings exactly. A token is the BLAKE2b digest of the path and value in
JSON, so any key or value (backticks, commas, kilobytes) filters safely. A
memory written before the field existed is found by a metadata filter in
Typesense once the index is rebuilt (``POST /admin/reindex``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

import msgspec

__all__ = ["FIELD", "document_tokens", "filter_tokens", "unsupported_path"]

#: The document field holding the tokens.
FIELD = "meta"

_STEP: list[Any] = []  # a step into an array (object keys are strings)


def _scalar(value: Any) -> Any:
    """A scalar as its token states it: numbers by their decimal value."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return {"n": _decimal(Decimal(repr(value)) if isinstance(value, float) else Decimal(value))}
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def _decimal(number: Decimal) -> str:
    """``number`` exactly, trailing zeros folded into the exponent (no rounding:
    ``Decimal.normalize`` would round to the context's 28 digits)."""
    sign, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)  # JSON has no NaN or infinity
    kept = list(digits)
    while len(kept) > 1 and kept[-1] == 0:
        kept.pop()
        exponent += 1
    if kept == [0]:
        sign, exponent = 0, 0
    return f"{'-' if sign else ''}{''.join(map(str, kept))}e{exponent}"


def _token(path: list[Any], value: Any) -> str:
    return hashlib.blake2b(msgspec.json.encode([*path, value]), digest_size=16).hexdigest()


def _nodes(value: Any, path: list[Any]) -> Iterator[str]:
    """A token for every node under ``path`` (containers and scalars)."""
    if isinstance(value, Mapping):
        yield _token(path, {})
        for key, item in value.items():
            yield from _nodes(item, [*path, key])
    elif isinstance(value, list):
        yield _token(path, [])
        for item in value:
            yield from _nodes(item, [*path, _STEP])
    else:
        yield _token(path, _scalar(value))


def _leaves(value: Any, path: list[Any]) -> Iterator[str]:
    """A token for every leaf under ``path``: scalars and empty containers."""
    if isinstance(value, Mapping) and value:
        for key, item in value.items():
            yield from _leaves(item, [*path, key])
    elif isinstance(value, list) and value:
        for item in value:
            yield from _leaves(item, [*path, _STEP])
    else:
        yield from _nodes(value, path)


def document_tokens(metadata: Mapping[str, Any]) -> list[str]:
    """The ``meta`` tokens of a memory's metadata (the root object has none)."""
    tokens: dict[str, None] = {}
    for key, item in metadata.items():
        tokens.update(dict.fromkeys(_nodes(item, [key])))
    return list(tokens)


def filter_tokens(metadata: Mapping[str, Any]) -> list[str]:
    """The tokens a document must all have to contain ``metadata`` (none for ``{}``).
    The filter must pass :func:`unsupported_path`."""
    tokens: dict[str, None] = {}
    for key, item in metadata.items():
        tokens.update(dict.fromkeys(_leaves(item, [key])))
    return list(tokens)


def unsupported_path(metadata: Any, where: str = "metadata") -> str | None:
    """Where ``metadata`` has an array holding an object or an array (the one
    containment tokens cannot state), as ``metadata.a[0]``; None if nowhere."""
    if isinstance(metadata, Mapping):
        for key, item in metadata.items():
            found = unsupported_path(item, f"{where}.{key}")
            if found is not None:
                return found
    elif isinstance(metadata, list):
        for i, item in enumerate(metadata):
            if isinstance(item, Mapping | list):
                return f"{where}[{i}]"
    return None
