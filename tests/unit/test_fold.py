"""The decay fold's arithmetic (indexers.postgres.fold), with the formula as the oracle."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import msgspec
import numpy as np
import pytest

from config import TierConfig
from indexers.postgres.fold import (
    MAX_EXPONENT,
    NEUTRAL_IMPORTANCE,
    Epoch,
    decay_rate,
    fold_index_ddl,
    fold_index_name,
    fold_vectors,
    importance_weights,
    objective,
)

DAY = 86_400.0
ANCHOR = datetime(2026, 1, 1, tzinfo=UTC)


def test_rate_is_ln2_over_the_half_life() -> None:
    assert decay_rate(30.0) == pytest.approx(math.log(2) / (30 * DAY), rel=1e-15)
    # One half-life after the anchor the age factor halves.
    e = Epoch("session", 1, 30.0, ANCHOR)
    assert e.scale(ANCHOR + timedelta(days=30)) == pytest.approx(0.5, rel=1e-12)
    assert e.exponent(ANCHOR - timedelta(days=60)) == pytest.approx(-2 * math.log(2), rel=1e-12)


def test_no_importance_weighs_the_neutral_half() -> None:
    assert NEUTRAL_IMPORTANCE == 0.5
    assert importance_weights([None, 0.0, 0.8, 1.0]).tolist() == [0.5, 0.0, 0.8, 1.0]


def test_the_folded_inner_product_is_the_objective_whatever_the_anchor() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((200, 24))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = rng.standard_normal(24)
    q /= np.linalg.norm(q)
    importance = [None if i % 7 == 0 else float(v) for i, v in enumerate(rng.random(200))]
    w = importance_weights(importance)
    ref = ANCHOR + timedelta(days=400)
    created = [ANCHOR + timedelta(days=float(d)) for d in rng.uniform(-300, 400, 200)]
    age = np.array([(ref - t).total_seconds() for t in created])
    truth = objective(x @ q, w, age, decay_rate(30.0))
    for anchor in (ANCHOR, ANCHOR + timedelta(days=365), ANCHOR - timedelta(days=700)):
        e = Epoch("session", 1, 30.0, anchor)
        after = np.array([(t - anchor).total_seconds() for t in created])
        folded = fold_vectors(x, w, after, e.rate)
        assert folded.dtype == np.float32
        got = (folded.astype(np.float64) @ q) * e.scale(ref)
        # float4 storage: about seven significant digits of the vector, so
        # the error is bounded by its norm (w x decay), not by the product.
        norm = objective(np.ones(len(w)), w, age, decay_rate(30.0))
        assert (np.abs(got - truth) <= 1e-6 * norm + 1e-300).all()
        assert list(np.argsort(-got, kind="stable")[:10]) == list(np.argsort(-truth, kind="stable")[:10])


def test_the_exponent_is_clamped_above_and_left_to_underflow_below() -> None:
    e = Epoch("session", 1, 1.0, ANCHOR)
    unit = np.ones((1, 4)) / 2.0
    # 1000 half-lives in the future: clamped to e^MAX_EXPONENT, finite in float4.
    far_future = fold_vectors(unit, np.ones(1), np.array([1000 * DAY]), e.rate)
    assert np.isfinite(far_future).all()
    assert float(np.linalg.norm(far_future.astype(np.float64))) == pytest.approx(math.exp(MAX_EXPONENT), rel=1e-6)
    # 200 half-lives before the anchor: underflows to zero, ranks last.
    ancient = fold_vectors(unit, np.ones(1), np.array([-200 * DAY]), e.rate)
    assert (ancient == 0).all()
    # And an e^MAX_EXPONENT vector times itself (an HNSW build does that) stays finite in float4.
    assert np.isfinite(np.float32(far_future[0] @ far_future[0]))


def test_fold_index_names_and_statement() -> None:
    t = TierConfig(holds="memories", m=12, ef_construction=48, objective="decayed")
    assert fold_index_name("session", 7) == "memories_fold_session_7"
    assert fold_index_name("long-term", 3) == "memories_fold_long_term_3"
    a, b = fold_index_name("a" * 62 + "1", 12345), fold_index_name("a" * 62 + "2", 12345)
    assert a != b and len(a + "_rebuild") <= 63
    assert fold_index_ddl("session", 7, t, "x", concurrently=True) == (
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS x ON memories USING hnsw (folded vector_ip_ops)"
        " WITH (m = 12, ef_construction = 48) WHERE tier = 'session' AND fold_epoch = 7"
    )
    with pytest.raises(ValueError, match="invalid tier name"):
        fold_index_name("x'; DROP TABLE memories; --", 1)


def test_tier_config_objective_keys() -> None:
    t = msgspec.convert({"objective": "decayed", "halfLifeDays": 7}, TierConfig)
    assert (t.objective, t.half_life_days) == ("decayed", 7.0)
    assert TierConfig().objective == "similarity" and TierConfig().half_life_days == 30.0
    with pytest.raises(msgspec.ValidationError, match="objective `decayed` applies to tiers holding memories only"):
        msgspec.convert({"holds": "entities", "objective": "decayed"}, TierConfig)
    with pytest.raises(msgspec.ValidationError, match=r"Expected `float` >= 0.01 - at `\$.halfLifeDays`"):
        msgspec.convert({"halfLifeDays": 0}, TierConfig)
