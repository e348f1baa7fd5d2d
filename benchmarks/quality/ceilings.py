"""Ceilings of rank fusion, read from LoCoMo reports (``quality.json`` layout).

``python -m benchmarks.quality.ceilings REPORT.json [...]`` prints, per
report, the fused R@10 beside what no fusion of the three lists can pass:
an oracle picking the best source per question (the mean of the
per-question maximum R@10) and the union of the three top-10s (up to 30
items); and the evidence each source alone brings into that union (in its
top 10 and in no other source's), the measure of how complementary they are.

A report records each evidence item's rank per source (``item_ranks``);
older ones only the ranks found (``hit_ranks``), which do not say which item
each source found when a question has several: the union is then given as
its bounds (the best source's count, and the sum capped at the evidence),
and the "only" shares are left out.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["SOURCES", "ceilings", "markdown"]

SOURCES = ("typesense", "pgvector", "graph")


def ceilings(report: Mapping[str, Any], k: int = 10) -> dict[str, float | None]:
    """R@k per config, ``oracle``, ``union`` (``union_high`` too: equal when
    exact), and ``only <source>`` (None without ``item_ranks``)."""
    questions = report["questions"]
    n = len(questions)
    exact = all("item_ranks" in q for q in questions)
    out: dict[str, float] = {name: 0.0 for name in (*SOURCES, "fused", "oracle", "union", "union_high")}
    out.update({f"only {s}": 0.0 for s in SOURCES})
    for q in questions:
        evidence = len(q["evidence"])
        counts = {name: sum(1 for r in q["hit_ranks"].get(name, []) if r <= k) for name in (*SOURCES, "fused")}
        for name, c in counts.items():
            out[name] += c / evidence / n
        out["oracle"] += max(counts[s] for s in SOURCES) / evidence / n
        if exact:
            found = {s: {i for i, r in enumerate(q["item_ranks"][s]) if r is not None and r <= k} for s in SOURCES}
            union = set().union(*found.values())
            out["union"] += len(union) / evidence / n
            out["union_high"] += len(union) / evidence / n
            for s in SOURCES:
                others = set().union(*(found[o] for o in SOURCES if o != s))
                out[f"only {s}"] += len(found[s] - others) / evidence / n
        else:
            out["union"] += max(counts[s] for s in SOURCES) / evidence / n
            out["union_high"] += min(evidence, sum(counts[s] for s in SOURCES)) / evidence / n
    result: dict[str, float | None] = dict(out)
    if not exact:
        result.update({f"only {s}": None for s in SOURCES})
    return result


def markdown(named: Mapping[str, Mapping[str, float | None]]) -> str:
    cols = ["fused", *SOURCES, "oracle", "union", *(f"only {s}" for s in SOURCES)]
    lines = [
        "| run | fused R@10 | " + " | ".join(c for c in cols[1:]) + " |",
        "|---|" + "---|" * len(cols),
    ]
    for name, c in named.items():
        cells = []
        for col in cols:
            value = c[col]
            if col == "union" and c["union_high"] is not None and value is not None and c["union_high"] - value > 5e-4:
                cells.append(f"{value:.3f}-{c['union_high']:.3f}")
            else:
                cells.append("n/a" if value is None else f"{value:.3f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quality.ceilings", description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", type=Path, nargs="+", help="LoCoMo report JSON files")
    args = parser.parse_args()
    print(markdown({p.stem: ceilings(json.loads(p.read_text())) for p in args.reports}))


if __name__ == "__main__":
    main()
