"""The expiry rule (indexers.lifecycle.Forgetting), with the formula as the oracle."""

from __future__ import annotations

import math

import msgspec
import pytest

from config import BraidConfig, LifecycleConfig, parse_config
from indexers.lifecycle import NEVER, Forgetting

DAY = 86400.0


def policy(retention: float | None = None, floor: float | None = None, half_life: float = 30.0) -> Forgetting:
    cfg = BraidConfig()
    tiers = {**cfg.tiers, "session": msgspec.structs.replace(cfg.tiers["session"], retention_days=retention)}
    lc = LifecycleConfig(forget_below=floor, half_life_days=half_life)
    return Forgetting.from_config(msgspec.structs.replace(cfg, tiers=tiers, lifecycle=lc))


def test_nothing_expires_by_default() -> None:
    f = Forgetting.from_config(BraidConfig())
    assert not f.ages
    assert f.dies_at(tier="session", created_s=0.0, importance=None, expires_s=None) == NEVER
    assert f.dies_at(tier="session", created_s=0.0, importance=0.0, expires_s=123.0) == 123.0
    sql, params = f.sql()
    assert sql == "(m.expires_at IS NULL OR m.expires_at > now())" and params == {}


def test_retention_is_per_tier() -> None:
    f = policy(retention=30.0)
    assert f.dies_at(tier="session", created_s=1000.0, importance=None, expires_s=None) == 1000.0 + 30 * DAY
    assert f.dies_at(tier="session", created_s=1000.0, importance=None, expires_s=2000.0) == 2000.0
    assert f.dies_at(tier="rag", created_s=1000.0, importance=None, expires_s=None) == NEVER
    sql, params = f.sql(tier="rag")
    assert "created_at" not in sql
    sql, params = f.sql(tier="session")
    assert params == {"lc_tier0": "session", "lc_keep0": 30 * DAY}


def test_activation_floor() -> None:
    f = policy(floor=0.25, half_life=1.0)
    # w * 2^(-age in days) = 0.25: importance 1 lasts 2 days, none (0.5) 1 day.
    assert f.dies_at(tier="rag", created_s=0.0, importance=1.0, expires_s=None) == pytest.approx(2 * DAY)
    assert f.dies_at(tier="rag", created_s=0.0, importance=None, expires_s=None) == pytest.approx(DAY)
    assert f.dies_at(tier="rag", created_s=0.0, importance=0.1, expires_s=None) < 0.0
    assert f.dies_at(tier="rag", created_s=0.0, importance=0.0, expires_s=None) < 0.0
    assert f.decay_per_s == pytest.approx(math.log(2) / DAY)


def test_the_yaml_keys() -> None:
    cfg = parse_config(
        "lifecycle:\n  forgetBelow: 0.1\n  halfLifeDays: 7\n  sweepIntervalS: 5\n  sweepBatch: 10\n"
        "cache:\n  ttlMs: 1500\n  maxEntries: 3\n"
        "tiers:\n  session: {holds: memories, retentionDays: 14}\n  entities: {holds: entities}\n"
    )
    assert cfg.lifecycle == LifecycleConfig(forget_below=0.1, half_life_days=7, sweep_interval_s=5, sweep_batch=10)
    assert (cfg.cache.ttl_ms, cfg.cache.max_entries) == (1500, 3)
    assert cfg.tiers["session"].retention_days == 14
    with pytest.raises(Exception, match="retentionDays applies to tiers holding memories only"):
        parse_config("tiers:\n  session: {holds: memories}\n  entities: {holds: entities, retentionDays: 3}\n")
