"""The fault ledger: what each fault or abuse test injected and what it saw.

Tests record one :class:`Scenario` each through the ``ledger`` fixture
(``tests/conftest.py``); the soak (:mod:`.soak`) records one of its own. When
``BRAID_FAULT_LEDGER`` names a file, the session appends every scenario to it
as one JSON line; ``make bench-faults`` sums them into
``benchmarks/results/faults.md`` and its closing ``faults:`` line. Outside
``make bench-faults`` the records are simply dropped. It lives here, beside
the report that reads it, so that tests import benchmarks and never the
other way round.

A test records its counts *before* asserting on them, so a failing run still
leaves the figures that made it fail.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

__all__ = ["Ledger", "Scenario"]


class Scenario(msgspec.Struct, kw_only=True):
    #: Short name, e.g. "postgres killed and restarted".
    name: str
    #: The group it is reported under: "fault", "bad input", "isolation", "soak".
    kind: str = "fault"
    #: Faults injected (kills, stalls, hostile requests...).
    injected: int = 0
    #: The load held while the fault was in place, in words.
    load: str = ""
    #: HTTP requests sent to Braid during the scenario.
    requests: int = 0
    #: Answers that were errors a client must handle (4xx/503 by design included).
    errors: int = 0
    #: 5xx answers other than a documented 503.
    server_errors: int = 0
    writes_acked: int = 0
    writes_found: int = 0
    #: Acknowledged writes missing from a store afterwards.
    lost_writes: int = 0
    duplicates: int = 0
    #: Rows of another tenant seen by a tenant.
    leaks: int = 0
    #: Responses that did not match the served OpenAPI schema.
    schema_failures: int = 0
    #: Seconds from the fault's end until the service answered fully again.
    recovery_s: float | None = None
    #: What the scenario answered or showed, in words.
    outcome: str = ""


class Ledger:
    def __init__(self, path: str | None) -> None:
        self.path = Path(path) if path else None
        self.scenarios: list[Scenario] = []

    @classmethod
    def from_env(cls) -> Ledger:
        return cls(os.environ.get("BRAID_FAULT_LEDGER"))

    def record(self, scenario: Scenario) -> Scenario:
        self.scenarios.append(scenario)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("ab") as f:
                f.write(msgspec.json.encode(scenario) + b"\n")
        return scenario
