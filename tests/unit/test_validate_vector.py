"""service.validate._vector: a client's vector, checked and scaled to unit length."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.validate import InputError, _vector


def reference(values: Sequence[float]) -> tuple[float, ...]:
    """The plain loops: scaled by the largest magnitude, then by the exact norm."""
    peak = max(abs(v) for v in values)
    scaled = [v / peak for v in values]
    norm = math.sqrt(math.fsum(v * v for v in scaled))
    return tuple(v / norm for v in scaled)


finite = st.floats(allow_nan=False, allow_infinity=False, width=64)


@given(st.lists(finite, min_size=8, max_size=8).filter(lambda v: any(v)))
def test_the_same_unit_vector_as_the_plain_loops_to_the_bit(values: list[float]) -> None:
    got = _vector(values, 8, "embedding")
    assert got == reference(values)
    assert all(type(v) is float for v in got)
    assert math.isclose(math.fsum(v * v for v in got), 1.0, rel_tol=1e-12)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([1.0, 2.0], "has 2 dimensions; expected 3"),
        ([1.0, math.nan, 0.0], "NaN or infinite"),
        ([1.0, math.inf, 0.0], "NaN or infinite"),
        ([0.0, 0.0, -0.0], "zero vector"),
    ],
)
def test_bad_vectors_are_refused_by_name(values: list[float], message: str) -> None:
    with pytest.raises(InputError, match=message):
        _vector(values, 3, "embedding")


def test_no_vector_is_none() -> None:
    assert _vector(None, 3, "embedding") is None
