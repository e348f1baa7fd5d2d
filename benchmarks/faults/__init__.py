"""``make bench-faults``: every fault test, a soak, and one report.

``python -m benchmarks.faults [--soak-minutes N]`` (:mod:`.__main__`) runs
the fault and abuse tests (``-m "faults or slow_faults"``) with the fault
ledger pointed at ``benchmarks/results/faults-ledger.jsonl``, then the soak
(:mod:`.soak`), then writes ``benchmarks/results/faults.md`` (:mod:`.report`)
and prints ``faults: injected=... schema_failures=...`` as its last line.
"""

__all__: list[str] = []
