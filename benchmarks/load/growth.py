"""How each load figure grows with size: every ``load-<n>.json`` in the results side by side.

``python -m benchmarks.load.growth`` (also run at the end of every load run)
writes ``benchmarks/results/load-growth.md`` (one row per figure, one column
per size) and ``load-growth.png`` (the latency and throughput figures against
size, log-log). With 100k and 1M both measured it also checks the issue's
"p50 at 1M <= 2 x p50 at 100k" (fused, 8 clients).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, pyplot, write_results

from .report import hnsw_min_recall

__all__ = ["FIGURES", "growth_table", "load_reports", "write_growth"]

Report = dict[str, Any]


def _row(config: str, clients: int) -> Callable[[Report], Report | None]:
    def find(report: Report) -> Report | None:
        return next(
            (
                r
                for r in report.get("recall", [])
                if r["config"] == config and r["clients"] == clients and r["embedding"] == "supplied"
            ),
            None,
        )

    return find


def _recall(config: str, clients: int, key: str) -> Callable[[Report], float | None]:
    def get(report: Report) -> float | None:
        row = _row(config, clients)(report)
        return None if row is None else row.get(key)

    return get


def _source(name: str) -> Callable[[Report], float | None]:
    def get(report: Report) -> float | None:
        row = _row(name, 1)(report)
        return None if row is None else row.get("sources_p50", {}).get(name)

    return get


def _fresh(rate: str, source: str) -> Callable[[Report], float | None]:
    def get(report: Report) -> float | None:
        return report.get("freshness", {}).get(rate, {}).get(source, {}).get("p99")

    return get


#: (label, unit, getter, plotted on the log-log latency/throughput axes)
FIGURES: list[tuple[str, str, Callable[[Report], float | None], bool]] = [
    ("fused p50, 1 client", "ms", _recall("fused", 1, "p50"), True),
    ("fused p50, 8 clients", "ms", _recall("fused", 8, "p50"), True),
    ("fused p99, 8 clients", "ms", _recall("fused", 8, "p99"), True),
    ("fused recalls/s, 8 clients", "1/s", _recall("fused", 8, "qps"), True),
    ("end-to-end / slowest source, 8 clients", "", _recall("fused", 8, "ratio_p50"), False),
    ("Typesense source p50, 1 client", "ms", _source("typesense"), True),
    ("pgvector source p50, 1 client", "ms", _source("pgvector"), True),
    ("graph source p50, 1 client", "ms", _source("graph"), True),
    ("bulk write ack", "memories/s", lambda r: r.get("write", {}).get("per_s"), True),
    ("raw Typesense import", "docs/s", lambda r: r.get("raw_typesense", {}).get("per_s"), True),
    ("freshness p99 at 100/s, Typesense", "ms", _fresh("100", "typesense"), False),
    ("freshness p99 at 100/s, pgvector", "ms", _fresh("100", "pgvector"), False),
    ("HNSW recall@10, smallest tier", "", lambda r: hnsw_min_recall(r.get("hnsw")), False),
]


def load_reports(results: Path = RESULTS) -> dict[int, Report]:
    """Every ``load-<n>.json`` under ``results``, by size, smallest first."""
    out: dict[int, Report] = {}
    for path in results.glob("load-*.json"):
        size = path.stem.removeprefix("load-")
        if size.isdigit():
            out[int(size)] = json.loads(path.read_text())
    return dict(sorted(out.items()))


def _fmt(value: float | None, unit: str) -> str:
    if value is None or value != value:  # None or NaN
        return "–"
    return f"{value:.3f}" if not unit else f"{value:.1f}" if value < 100 else f"{value:.0f}"


def growth_table(reports: dict[int, Report]) -> list[str]:
    sizes = list(reports)
    lines = [
        "| figure | unit | " + " | ".join(f"{s:,}" for s in sizes) + " |",
        "|---|---|" + "---|" * len(sizes),
    ]
    for label, unit, get, _ in FIGURES:
        lines.append(f"| {label} | {unit} | " + " | ".join(_fmt(get(reports[s]), unit) for s in sizes) + " |")
    p50 = _recall("fused", 8, "p50")
    if 100_000 in reports and 1_000_000 in reports:
        a, b = p50(reports[100_000]), p50(reports[1_000_000])
        if a and b:
            verdict = "PASS" if b <= 2 * a else "**FAIL**"
            lines += ["", f"- {verdict}: fused p50 at 8 clients, 1M {b:.1f} ms <= 2 x 100k {a:.1f} ms"]
    else:
        lines += ["", "- not checked: p50 at 1M <= 2 x p50 at 100k (needs both load-100000.json and load-1000000.json)"]
    return lines


def _plot(reports: dict[int, Report], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    sizes = list(reports)
    fig, (lat, thr) = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, unit, get, plotted in FIGURES:
        if not plotted:
            continue
        points = [(s, get(reports[s])) for s in sizes]
        points = [(s, v) for s, v in points if v is not None and v == v and v > 0]
        if not points:
            continue
        ax = lat if unit == "ms" else thr
        ax.plot([s for s, _ in points], [v for _, v in points], marker="o", label=f"{label} ({unit})")
    for ax, title in ((lat, "latency, ms"), (thr, "throughput")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("memories in the big tenant")
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.suptitle("Braid load figures against size (log-log, 2 cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_growth(results: Path = RESULTS) -> Path | None:
    """Write ``load-growth.md`` and ``.png`` from the load reports there; None if there are none."""
    reports = load_reports(results)
    if not reports:
        return None
    commands = "; ".join(f"{s:,}: `{r.get('command', '?')}`" for s, r in reports.items())
    md = write_results(
        "load-growth",
        "\n".join(
            [
                "# Load figures against size",
                "",
                f"From the `load-<n>.json` reports in this folder ({commands}). "
                "Each column is its own run on this machine; see each `load-<n>.md` for the details.",
                "",
                *growth_table(reports),
                "",
            ]
        ),
        results=results,
    )
    _plot(reports, results / "load-growth.png")
    return md


if __name__ == "__main__":
    print(f"load: growth at {write_growth()}")
