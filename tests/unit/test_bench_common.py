"""benchmarks.common: the CPU meter's accounting and the results writer, with exact values."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import psutil

from benchmarks.common import CpuMeter, cpu_per_call, cpu_used, pct, speed_probe, write_results


class Proc:
    """A process whose CPU time the test sets; ``gone`` makes it vanish as an exited one does."""

    def __init__(self, pid: int, cpu: float) -> None:
        self.pid, self.cpu, self.gone = pid, cpu, False

    def cpu_times(self) -> SimpleNamespace:
        if self.gone:
            raise psutil.NoSuchProcess(self.pid)
        return SimpleNamespace(user=self.cpu, system=0.0)


def test_the_first_reading_is_each_kinds_cpu_so_far_client_last() -> None:
    service, postmaster, backend = Proc(1, 2.0), Proc(2, 0.5), Proc(3, 0.25)
    meter = CpuMeter(lambda: {"service": [service], "postgres": [postmaster, backend, backend]})
    reading = meter()
    assert list(reading) == ["service", "postgres", "client"]
    assert (reading["service"], reading["postgres"]) == (2.0, 0.75)
    assert reading["client"] > 0


def test_new_processes_count_from_their_start_and_exited_ones_keep_what_was_counted() -> None:
    postmaster, backend = Proc(2, 1.0), Proc(3, 0.5)
    procs = [postmaster, backend]
    meter = CpuMeter(lambda: {"postgres": procs})
    first = meter()
    postmaster.cpu, backend.cpu = 1.5, 0.75
    backend.gone = True  # exits between two readings: its last 0.25 s is not seen
    newcomer = Proc(4, 0.125)
    procs.append(newcomer)
    second = meter()
    assert cpu_used(first, second)["postgres"] == 0.5 + 0.125
    assert second["postgres"] == 2.125
    procs[:] = [postmaster]
    assert meter()["postgres"] == 2.125  # a total never goes down


def test_cpu_per_call_is_ms_per_call_by_kind_sorted() -> None:
    before = {"service": 1.0, "postgres": 2.0, "client": 0.5}
    after = {"service": 1.5, "postgres": 2.25, "client": 0.625, "typesense": 0.25}
    assert list(cpu_per_call(before, after, 5).items()) == [
        ("client", 25.0),
        ("postgres", 50.0),
        ("service", 100.0),
        ("typesense", 50.0),
    ]
    assert cpu_per_call(before, after, 0)["service"] == 500.0


def test_pct_of_nothing_is_nan() -> None:
    assert math.isnan(pct([], 50))
    assert pct([1.0, 2.0, 3.0], 50) == 2.0


def test_write_results_writes_markdown_and_json(tmp_path: Path) -> None:
    out = tmp_path / "results"
    md = write_results("run", "# Run\n", {"p50": 1.5, "path": Path("/x")}, results=out)
    assert md == out / "run.md"
    assert md.read_text() == "# Run\n"
    assert (out / "run.json").read_text() == '{\n "p50": 1.5,\n "path": "/x"\n}\n'
    assert json.loads((out / "run.json").read_text()) == {"p50": 1.5, "path": "/x"}
    write_results("only", "text\n", results=out)
    assert not (out / "only.json").exists()


def test_the_speed_probe_costs_this_process_a_positive_amount_of_cpu_and_about_the_same_each_time() -> None:
    first, second = speed_probe(rounds=3), speed_probe(rounds=3)
    assert first > 0 and second > 0
    assert 0.2 < first / second < 5  # the same work: never an order of magnitude apart
