"""Forgetting: when a memory expires, as one rule every store applies.

A memory expires at the earliest of

* its ``expires_at`` (from the write's ``expires_at`` or ``ttl_seconds``);
* ``created_at + tiers.<tier>.retentionDays``, when its tier has a retention;
* with ``lifecycle.forgetBelow`` = f set, the instant its activation
  ``w * exp(-lambda * age)`` reaches f: ``created_at + (ln w - ln f) / lambda``,
  w its importance (0.5 when it has none), lambda = ln 2 / ``lifecycle.halfLifeDays``,
  age = now - ``created_at``.

An expired memory is never returned: Postgres reads apply :meth:`Forgetting.sql`
(``now()`` is the transaction's clock), the Typesense source checks
:meth:`Forgetting.dies_at` on its hits against the service's clock. The
sweeper (:mod:`indexers.sweep`) then removes it from every store. The rule
is read from the live config, so a reload that shortens a retention applies
at the next recall.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

import msgspec

from config import BraidConfig

__all__ = ["NEVER", "Forgetting", "NO_IMPORTANCE_WEIGHT"]

#: The weight w of a memory written without importance.
NO_IMPORTANCE_WEIGHT = 0.5

#: ``dies_at`` of a memory nothing makes expire.
NEVER = math.inf

#: ln of the weight of an importance of 0 (ln 0 is -inf; any floor forgets it at once).
_LN_TINY = math.log(1e-30)


class Forgetting(msgspec.Struct, frozen=True):
    """The expiry rule of one config (:meth:`from_config`)."""

    #: tier -> retention in seconds, for the tiers that have one.
    retention_s: dict[str, float] = {}
    #: ln(forgetBelow), or None when the activation floor is off.
    ln_floor: float | None = None
    #: The activation's decay rate lambda, per second.
    decay_per_s: float = 0.0

    @classmethod
    def from_config(cls, cfg: BraidConfig) -> Forgetting:
        lc = cfg.lifecycle
        return cls(
            retention_s={
                name: t.retention_days * 86400.0
                for name, t in cfg.tiers.items()
                if t.holds == "memories" and t.retention_days is not None
            },
            ln_floor=None if lc.forget_below is None else math.log(lc.forget_below),
            decay_per_s=math.log(2) / (lc.half_life_days * 86400.0),
        )

    @property
    def ages(self) -> bool:
        """Whether memories expire by age (a retention or the floor), not only by ``expires_at``."""
        return bool(self.retention_s) or self.ln_floor is not None

    def dies_at(self, *, tier: str, created_s: float, importance: float | None, expires_s: float | None) -> float:
        """The epoch second the memory expires at (:data:`NEVER` if nothing ends it);
        it is expired from that instant on."""
        end = NEVER if expires_s is None else expires_s
        retention = self.retention_s.get(tier)
        if retention is not None:
            end = min(end, created_s + retention)
        if self.ln_floor is not None:
            w = NO_IMPORTANCE_WEIGHT if importance is None else importance
            ln_w = math.log(w) if w > 1e-30 else _LN_TINY
            end = min(end, created_s + (ln_w - self.ln_floor) / self.decay_per_s)
        return end

    def dies_at_of(self, memory: Any) -> float:
        """:meth:`dies_at` of anything with the shown fields (a hit, a recalled item)."""
        created: datetime = memory.created_at
        expires: datetime | None = memory.expires_at
        return self.dies_at(
            tier=memory.tier,
            created_s=created.timestamp(),
            importance=memory.importance,
            expires_s=None if expires is None else expires.timestamp(),
        )

    def sql(self, alias: str = "m", tier: str | None = None) -> tuple[str, dict[str, Any]]:
        """The SQL condition a live (not expired) memory meets at ``now()``, and
        its parameters. With ``tier``, only that tier's retention is named."""
        a = alias
        conds = [f"({a}.expires_at IS NULL OR {a}.expires_at > now())"]
        params: dict[str, Any] = {}
        for i, (name, seconds) in enumerate(sorted(self.retention_s.items())):
            if tier is not None and name != tier:
                continue
            params[f"lc_tier{i}"] = name
            params[f"lc_keep{i}"] = seconds
            same = f"{a}.created_at > now() - make_interval(secs => %(lc_keep{i})s)"
            conds.append(same if tier is not None else f"({a}.tier <> %(lc_tier{i})s OR {same})")
        if self.ln_floor is not None:
            params["lc_ln_floor"] = self.ln_floor
            params["lc_decay"] = self.decay_per_s
            conds.append(
                f"ln(greatest(coalesce({a}.importance, {NO_IMPORTANCE_WEIGHT}), 1e-30)::float8)"
                f" - %(lc_ln_floor)s::float8"
                f" > %(lc_decay)s::float8 * extract(epoch FROM now() - {a}.created_at)::float8"
            )
        return " AND ".join(conds), params

    def sweep_sql(self, alias: str = "m") -> tuple[str, dict[str, Any]]:
        """The SQL condition an expired memory meets (the negation of :meth:`sql`),
        written so that each way of expiring can use an index: ``expires_at``
        its partial index, age ``created_at``'s."""
        a = alias
        live, params = self.sql(alias)
        ways = [f"{a}.expires_at <= now()"]
        for i, (_name, _seconds) in enumerate(sorted(self.retention_s.items())):
            ways.append(
                f"({a}.tier = %(lc_tier{i})s AND {a}.created_at <= now() - make_interval(secs => %(lc_keep{i})s))"
            )
        if self.ln_floor is not None:
            # Nothing younger than (ln 1 - ln f) / lambda has decayed to the floor (w <= 1).
            params["lc_youngest"] = -self.ln_floor / self.decay_per_s
            ways.append(f"{a}.created_at <= now() - make_interval(secs => %(lc_youngest)s)")
        return f"({' OR '.join(ways)}) AND NOT ({live})", params
