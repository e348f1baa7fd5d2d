"""Weighted RRF, with the formula sum(w_s / (k + rank_s)) as the oracle."""

from __future__ import annotations

import msgspec
import pytest

import fusion
from fusion import Fused, rrf


def approx(value: float) -> object:
    return pytest.approx(value, rel=1e-15, abs=0.0)


def test_two_lists_k60() -> None:
    fused = rrf({"a": ["x", "y", "z"], "b": ["y", "w"]})
    assert [f.id for f in fused] == ["y", "x", "w", "z"]
    y, x, w, z = fused
    assert y.score == approx(1 / 62 + 1 / 61)
    assert y.ranks == {"a": 2, "b": 1}
    assert y.contributions == {"a": 1 / 62, "b": 1 / 61}
    assert x == Fused("x", 1 / 61, {"a": 1}, {"a": 1 / 61})
    assert w == Fused("w", 1 / 62, {"b": 2}, {"b": 1 / 62})
    assert z == Fused("z", 1 / 63, {"a": 3}, {"a": 1 / 63})


def test_k_changes_the_scores() -> None:
    fused = rrf({"a": ["x", "y"], "b": ["x"]}, k=1)
    assert [(f.id, f.score) for f in fused] == [("x", approx(1 / 2 + 1 / 2)), ("y", approx(1 / 3))]


def test_equal_scores_break_on_best_rank_then_id() -> None:
    # k=1: n = 1/2 (b rank 1), z-p = 1/2 (a rank 1), a-q = 1/4 + 1/4 (rank 3 twice),
    # m = 1/3 (a rank 2), o = 1/3 (b rank 2).
    fused = rrf({"a": ["z-p", "m", "a-q"], "b": ["n", "o", "a-q"]}, k=1)
    assert [(f.id, f.score) for f in fused] == [
        ("n", 0.5),
        ("z-p", 0.5),
        ("a-q", 0.5),
        ("m", approx(1 / 3)),
        ("o", approx(1 / 3)),
    ]


def test_permuted_rank_patterns_score_exactly_equal() -> None:
    fused = rrf({"a": ["z", "y", "x"], "b": ["x", "z", "y"], "c": ["y", "x", "z"]})
    assert [f.id for f in fused] == ["x", "y", "z"]
    assert fused[0].score == fused[1].score == fused[2].score
    assert fused[0].score == approx(1 / 61 + 1 / 62 + 1 / 63)


def test_weights_typesense_keyword_and_vector() -> None:
    weights = {"vector": 0.7, "keyword": 0.3}
    fused = rrf({"keyword": ["a", "b"], "vector": ["b", "c"]}, weights=weights)
    assert [f.id for f in fused] == ["b", "c", "a"]
    b, c, a = fused
    assert b.score == approx(0.3 / 62 + 0.7 / 61)
    assert b.contributions == {"keyword": 0.3 / 62, "vector": 0.7 / 61}
    assert c.score == approx(0.7 / 62)
    assert a.score == approx(0.3 / 61)


def test_source_missing_from_weights_weighs_one() -> None:
    fused = rrf({"a": ["x"], "b": ["y"]}, weights={"a": 2.0})
    assert [(f.id, f.score) for f in fused] == [("x", approx(2 / 61)), ("y", approx(1 / 61))]


def test_weight_zero_reports_rank_but_adds_nothing() -> None:
    fused = rrf({"g": ["x", "y"], "a": ["y"]}, weights={"g": 0.0})
    assert fused == [
        Fused("y", 1 / 61, {"g": 2, "a": 1}, {"g": 0.0, "a": 1 / 61}),
        Fused("x", 0.0, {"g": 1}, {"g": 0.0}),
    ]


def test_duplicate_id_counts_at_its_best_rank_only() -> None:
    fused = rrf({"a": ["x", "y", "x", "z"]})
    assert fused == [
        Fused("x", 1 / 61, {"a": 1}, {"a": 1 / 61}),
        Fused("y", 1 / 62, {"a": 2}, {"a": 1 / 62}),
        Fused("z", 1 / 64, {"a": 4}, {"a": 1 / 64}),
    ]


def test_empty_inputs() -> None:
    assert rrf({}) == []
    assert rrf({"a": [], "b": []}) == []


@pytest.mark.parametrize("k", [0, -5])
def test_k_below_one_is_refused(k: int) -> None:
    with pytest.raises(ValueError) as info:
        rrf({"a": ["x"]}, k=k)
    assert str(info.value) == f"k must be >= 1, got {k}"


@pytest.mark.parametrize(("weight", "shown"), [(-0.5, "-0.5"), (float("nan"), "nan"), (float("inf"), "inf")])
def test_bad_weight_is_refused(weight: float, shown: str) -> None:
    with pytest.raises(ValueError) as info:
        rrf({"a": ["x"]}, weights={"a": 1.0, "vector": weight})
    assert str(info.value) == f"weight of source 'vector' must be finite and >= 0, got {shown}"


def test_fused_is_frozen_and_encodes() -> None:
    (x,) = rrf({"a": ["x"]})
    with pytest.raises(AttributeError):
        x.score = 1.0  # type: ignore[misc]
    assert msgspec.json.decode(msgspec.json.encode(x), type=Fused) == x


def test_exports() -> None:
    """Every name a fusion module exports is exported by the package, and nothing else."""
    import importlib
    import pkgutil

    modules = [importlib.import_module(f"fusion.{m.name}") for m in pkgutil.iter_modules(fusion.__path__)]
    exported = {name for module in modules for name in getattr(module, "__all__", [])}
    assert sorted(fusion.__all__) == sorted(exported)
    for name in fusion.__all__:
        assert hasattr(fusion, name)
