"""benchmarks.load.run.quiet: a metered phase starts on an idle stack, and
what the stack spent meanwhile is reported, not dropped."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from benchmarks.load.report import _flush_row, _quiet_row
from benchmarks.load.run import quiet


class Meter:
    """Cumulative CPU seconds by kind; each reading adds the next step's use."""

    def __init__(self, steps: Iterator[dict[str, float]]) -> None:
        self.steps, self.total = steps, {"service": 0.0, "typesense": 0.0, "client": 0.0}

    def __call__(self) -> dict[str, float]:
        step = next(self.steps, {})
        self.total = {k: v + step.get(k, 0.0) for k, v in self.total.items()}
        return dict(self.total)


def _busy_then_idle(busy: int) -> Iterator[dict[str, float]]:
    yield {}
    for _ in range(busy):
        yield {"typesense": 0.2, "client": 0.5}  # the client's own use never counts
    while True:
        yield {"service": 0.01, "typesense": 0.01, "client": 0.5}


def test_it_waits_until_every_server_process_stayed_idle_for_the_windows_and_counts_what_they_spent() -> None:
    q = asyncio.run(quiet(Meter(_busy_then_idle(4)), window=0.001, windows=3, idle_share=0.05 / 0.001))  # type: ignore[arg-type]
    assert q["idle"]
    # 4 busy readings, then 3 idle ones: 7 readings after the first.
    assert round(q["cpu_ms"]["typesense"]) == 4 * 200 + 3 * 10
    assert round(q["cpu_ms"]["service"]) == 3 * 10


def test_a_busy_reading_starts_the_idle_count_again() -> None:
    steps = iter([{}, {}, {}, {"typesense": 1.0}, {}, {}, {}])
    q = asyncio.run(quiet(Meter(steps), window=0.001, windows=3, idle_share=1.0))  # type: ignore[arg-type]
    assert q["idle"] and round(q["cpu_ms"]["typesense"]) == 1000


def test_it_gives_up_at_the_timeout_and_says_so() -> None:
    always = iter(lambda: {"typesense": 1.0}, None)
    q = asyncio.run(quiet(Meter(always), window=0.001, windows=3, idle_share=1.0, timeout=0.02))  # type: ignore[arg-type]
    assert not q["idle"] and q["cpu_ms"]["typesense"] >= 1000


def test_the_report_row_names_each_wait_and_older_reports_say_they_had_none() -> None:
    assert "no (older run)" in _quiet_row({})
    q = {"seconds": 12.4, "idle": True, "cpu_ms": {"typesense": 830.0}, "idle_share": 0.05, "idle_for_s": 3.0}
    row = _quiet_row({"drain": {"quiet": q}, "quiet_before_recalls": {**q, "idle": False}})
    assert "under 5% of a core for 3 s" in row
    assert "after the drain: 12 s, CPU ms 0.00 / 0.00 / 830.00 / 0.00" in row
    assert "before the recall rows: 12 s (still busy)" in row and "direct" not in row


def test_the_flush_row_names_both_flushes_and_older_reports_have_none() -> None:
    assert _flush_row({}) is None
    row = _flush_row({"flush_before_recalls": {"seconds": 0.21}, "flush_before_direct": {"seconds": 2.04}})
    assert row is not None
    assert "before the recall rows: 0.2 s; before the direct baselines: 2.0 s" in row
