"""benchmarks.engine_phases' timing wrappers and report, without a stack."""

from __future__ import annotations

import asyncio
import time

from benchmarks.engine_phases import Phases, markdown, medians, summary_line, top_level


class Worker:
    def busy(self, n: int) -> int:
        end = time.process_time() + 0.002
        while time.process_time() < end:
            pass
        return n + 1

    async def later(self, n: int) -> int:
        await asyncio.sleep(0)
        return self.busy(n)


def test_a_wrapped_method_adds_its_cpu_and_is_restored() -> None:
    phases = Phases()
    original = Worker.__dict__["busy"]
    with phases.wrapped(Worker, "busy", "busy"):
        assert Worker().busy(1) == 2
        assert Worker().busy(2) == 3
    assert Worker.__dict__["busy"] is original
    assert phases.spent["busy"] >= 0.004
    Worker().busy(3)  # not counted once restored
    assert phases.spent["busy"] < 0.004 + 0.002


def test_an_async_function_is_timed_across_its_awaits() -> None:
    phases = Phases()
    with phases.wrapped(Worker, "later", "later"):
        assert asyncio.run(Worker().later(4)) == 5
    assert phases.spent["later"] >= 0.002


def test_other_is_the_recall_outside_the_top_level_phases() -> None:
    passes = [
        {"recall": 10.0, "plan": 1.0, "source.graph": 4.0, "graph.seeds": 2.0},
        {"recall": 12.0, "plan": 1.0, "source.graph": 5.0},
    ]
    m = medians(passes)
    # graph.seeds is inside source.graph: not subtracted again; a pass without it counts 0.
    assert m["other"] == statistics_median([10.0 - 5.0, 12.0 - 6.0])
    assert m["graph.seeds"] == 1.0
    assert top_level("source.graph") and top_level("live check") and not top_level("graph.seeds")
    report = {"command": "x", "size": 10, "recalls": 5, "passes": 2, "medians": m}
    assert "| graph.seeds | 1.000 |" in markdown(report)
    assert summary_line(report) == "engine-phases: recalls=5 ms=11.00 plan=1.00 source.graph=4.50 other=5.50"


def statistics_median(values: list[float]) -> float:
    values = sorted(values)
    return (values[0] + values[1]) / 2
