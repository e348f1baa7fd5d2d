"""The Markdown report, JSON dump and bar chart of a LongMemEval or BEAM run."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, pyplot, write_results

from ..ceilings import ORACLE_KEYS
from .common import Column, Suite

__all__ = ["markdown", "value", "write_outputs"]

TITLES = {"longmemeval": "LongMemEval_S (dev part)", "beam": "BEAM 100K (dev half)"}


def value(score: Mapping[str, Any], column: Column) -> float:
    """A score's figure for ``(kind, metric)``; ``kind`` "all" is the overall one. NaN if absent."""
    kind, metric = column
    where = score.get("overall", {}) if kind == "all" else score.get("by_kind", {}).get(kind, {})
    return float(where.get(metric, math.nan))


def _f(x: float) -> str:
    return "–" if math.isnan(x) else f"{x:.3f}"


def _label(column: Column) -> str:
    kind, metric = column
    return metric if kind == "all" else f"{kind} {metric}"


def _table(
    report: Mapping[str, Any], suite: Suite, columns: Sequence[Column], extra: bool = False, short: bool = False
) -> list[str]:
    """Rows: each config, the naive retrievers of this run, the README's references.
    ``extra`` adds the empty and degraded counts, ``short`` heads columns by metric alone."""
    head = [c[1] if short else _label(c) for c in columns] + (["empty", "degraded"] if extra else [])
    lines = ["| retriever | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
    for name, score in report["configs"].items():
        cells = [_f(value(score, c)) for c in columns]
        if extra:
            cells += [str(score["empty"]), str(score["degraded"])]
        lines.append(f"| **{name}** | " + " | ".join(cells) + " |")
    pad = ["", ""] if extra else []
    official = all(metric.startswith("official ") for _, metric in columns)
    for name, score in report.get("naive", {}).items():
        if name.endswith(" official") and not official:
            continue  # a user-turns-only ranking, scored by the official figures alone
        lines.append(f"| naive {name} (this run) | " + " | ".join([_f(value(score, c)) for c in columns] + pad) + " |")
    for name, ref in suite.reference.items():
        if any(c in ref for c in columns):
            lines.append(f"| {name} | " + " | ".join([_f(ref.get(c, math.nan)) for c in columns] + pad) + " |")
    return lines


def _kinds(report: Mapping[str, Any]) -> dict[str, int]:
    return {k: v["n"] for k, v in next(iter(report["configs"].values()))["by_kind"].items()}


def markdown(report: Mapping[str, Any], suite: Suite) -> str:
    w, emb, mapping = report["write"], report["embedding"], report["mapping"]
    check = report["embedding_check"]
    cpu = "; ".join(
        f"{step} " + ", ".join(f"{k} {v:.0f} s" for k, v in by_kind.items()) for step, by_kind in w["cpu_s"].items()
    )
    lines = [
        f"# Retrieval quality on {TITLES.get(suite.name, suite.name)} (through the HTTP API)",
        "",
        f"Command: `{report['command']}`  ",
        f"Data: `{report['data']}`; corpus: {report['corpus']}  ",
        f"Service: the working tree at {report['tree']['commit']}"
        + (
            f" with uncommitted changes to {', '.join(f'`{p}`' for p in report['tree']['changed'])}  "
            if report["tree"]["changed"]
            else "  "
        ),
        f"Mapping: {report['options']}; {mapping['memories']} memories, one tenant per "
        f"{'question' if suite.name == 'longmemeval' else 'chat'}; {mapping['cut_to_max_chars']} had content "
        f"or context cut to {mapping['max_chars']} characters (`limits.maxContentChars`); "
        f"{mapping['context_chars']:,} characters of context, {mapping['entities']:,} entity mentions "
        f"({mapping['distinct_entities']:,} distinct names per tenant, summed; at most "
        f"{mapping['max_entities']} named per memory).  ",
        f"Each recall: `top_k` {report['top_k']}, `budget_tokens` 65536, `min_confidence` 0, "
        f"{report['concurrency']} in flight; `reference_time` = the question's time, `track` true on the "
        "fused recall only.  ",
        f"Embeddings: computed client-side with the service's model for {emb['texts']} turns "
        f"({emb['computed']} computed, the rest from `{emb['cache']}`); against the service's own vectors for "
        f"{check['texts']} probe texts: {check['identical']} bit-identical, max |diff| {check['max_abs_diff']:.2e}, "
        f"min cosine {check['min_cosine']:.7f}.  ",
        f"Writes: {w['memories']} memories in {w['requests']} requests ({w.get('splits', 0)} writes split in two "
        "after a 503 from the service's 10 s Postgres deadline), "
        f"{w['write_s']:.0f} s "
        f"({w['per_s']:.0f} memories/s), then {w['sync_wait_s']:.0f} s for the Typesense outbox to drain. "
        f"CPU by process: {cpu}.",
        "",
        "| phase | wall s |",
        "|---|---|",
        *(f"| {name} | {s:.1f} |" for name, s in report["phases"].items()),
        f"| **total** | {report['elapsed_s']:.1f} |",
        "",
        "## Overall",
        "",
        *_table(report, suite, suite.headline, extra=True),
    ]
    lines += _ceilings(report, suite)
    for title, columns in suite.tables.items():
        lines += ["", f"## {title[0].upper()}{title[1:]}", "", *_table(report, suite, columns)]
    headline_metrics = [m for kind, m in suite.headline if kind == "all"]
    if headline_metrics:
        for kind, n in _kinds(report).items():
            columns = [(kind, m) for m in headline_metrics]
            lines += ["", f"## {kind} (n={n})", "", *_table(report, suite, columns, short=True)]
    if suite.notes:
        lines += ["", "## Notes", ""]
        for note in suite.notes:
            lines += [note, ""]
        lines.pop()
    if skipped := report["corpus"].get("skipped"):
        lines += ["", "Skipped questions: " + "; ".join(skipped) + "."]
    lines += ["", "## Degraded recalls", ""]
    degraded = {n: c["degraded"] for n, c in report["configs"].items()}
    if any(degraded.values()):
        lines.append(
            "**Some recalls were degraded** (a source missed its deadline on the shared 2-core machine; "
            "such a recall ranks without that source): "
            + "; ".join(f"{n} {d} ({report['configs'][n]['degraded_by']})" for n, d in degraded.items() if d)
            + "."
        )
    else:
        lines.append(f"None: every source answered within its deadline in all {report['asked']} recalls per config.")
    cold = report["cold_embedding_ms"]
    lines += [
        "",
        "## Recall latency",
        "",
        f"Client-side, {report['concurrency']} in flight, query embeddings cached by a warm-up pass "
        f"(p50 {cold['p50']:.1f} ms, p95 {cold['p95']:.1f} ms per query).",
        "",
        "| config | p50 ms | p95 ms | recalls/s | per-source p50 ms (server) | factors applied |",
        "|---|---|---|---|---|---|",
    ]
    for name, c in report["configs"].items():
        src = ", ".join(f"{k} {v:.1f}" for k, v in c["source_ms_p50"].items())
        lat = c["latency_ms"]
        factors = ", ".join(f"{k} {v}" for k, v in c["factors"].items()) or "none"
        lines.append(f"| {name} | {lat['p50']:.1f} | {lat['p95']:.1f} | {c['recalls_per_s']:.1f} | {src} | {factors} |")
    if sweep := report.get("sweep"):
        lines += ["", "## Sweep (fused, `track` false, after one ingestion)", ""]
        lines += ["| set | " + " | ".join(_label(c) for c in suite.headline) + " | degraded |"]
        lines += ["|---|" + "---|" * (len(suite.headline) + 1)]
        for row in sweep:
            cells = [_f(value(row["score"], c)) for c in suite.headline]
            lines.append(f"| {row['name']} | " + " | ".join(cells) + f" | {row['score']['degraded']} |")
        lines += _sweep_sources(sweep, suite)
    lines += ["", f"`{suite.summary_line(report)}`", ""]
    return "\n".join(lines)


def _ceilings(report: Mapping[str, Any], suite: Suite) -> list[str]:
    """The oracle's figures beside the fused ones, and the union's (:mod:`..ceilings`)."""
    ceiling = report.get("ceilings")
    if not ceiling:
        return []
    columns = suite.headline
    fused = report["configs"]["fused"]
    lines = [
        "",
        "## Ceilings",
        "",
        "What fusion could reach with these lists (`benchmarks/quality/ceilings.py`): an oracle picking the best "
        "single source per question; the union of the three top-10s (up to 30 memories, as one list).",
        "",
        "| | " + " | ".join(_label(c) for c in columns) + " |",
        "|---|" + "---|" * len(columns),
        "| fused | " + " | ".join(_f(value(fused, c)) for c in columns) + " |",
        "| oracle | " + " | ".join(_f(value(ceiling["oracle"], c)) for c in columns) + " |",
    ]
    union = ceiling.get("union", {})
    if union:
        lines.append(
            "| union of top-10s | "
            + " | ".join(_f(union.get(c[1], math.nan)) if c[0] == "all" else "–" for c in columns)
            + " |"
        )
    return lines


def _sweep_sources(sweep: Sequence[Mapping[str, Any]], suite: Suite) -> list[str]:
    """Each sweep row's sources alone, fused and ceilings (``--sweep-sources``):
    the headline figures, and the first overall one per question kind."""
    rows = [r for r in sweep if "configs" in r["score"]]
    if not rows:
        return []
    columns = suite.headline
    # Per kind, the figure the oracle picks a source by first (LongMemEval: turn all@10).
    per_kind = ORACLE_KEYS.get(suite.name, (None,))[0]
    kinds = list(rows[0]["score"]["by_kind"]) if per_kind else []
    head = [_label(c) for c in columns] + [f"{k} {per_kind}" for k in kinds]
    lines = [
        "",
        "Each source alone under each set, fused, and the ceilings (oracle: the best source per question; "
        "union: the three top-10s as one list):",
        "",
        "| set | list | " + " | ".join(head) + " |",
        "|---|---|" + "---|" * len(head),
    ]
    for row in rows:
        s = row["score"]
        union = s["ceilings"].get("union", {})
        named = [*((n, s["configs"][n]) for n in ("typesense", "pgvector", "graph")), ("fused", s)]
        named.append(("oracle", s["ceilings"]["oracle"]))
        for name, score in named:
            cells = [_f(value(score, c)) for c in columns]
            cells += [_f(score["by_kind"][k].get(per_kind or "", math.nan)) for k in kinds]
            lines.append(f"| {row['name']} | {name} | " + " | ".join(cells) + " |")
        if union:
            cells = [_f(union.get(c[1], math.nan)) if c[0] == "all" else "–" for c in columns] + ["–"] * len(kinds)
            lines.append(f"| {row['name']} | union | " + " | ".join(cells) + " |")
    return lines


def plot(report: Mapping[str, Any], suite: Suite, path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    columns = suite.headline
    bars: dict[str, list[float]] = {n: [value(s, c) for c in columns] for n, s in report["configs"].items()}
    if bm25 := report.get("naive", {}).get("bm25"):
        bars["naive BM25 (this run)"] = [value(bm25, c) for c in columns]
    for name, ref in suite.reference.items():
        if all(c in ref for c in columns):
            bars[name] = [ref[c] for c in columns]
    fig, ax = plt.subplots(figsize=(10, 4.8))
    width = 0.8 / len(bars)
    for i, (name, values) in enumerate(bars.items()):
        xs = [j + (i - (len(bars) - 1) / 2) * width for j in range(len(columns))]
        ax.bar(xs, [0 if math.isnan(v) else v for v in values], width, label=name)
    ax.set_xticks(range(len(columns)))
    ax.set_xticklabels([_label(c) for c in columns], fontsize=8)
    ax.set_ylim(0, 1)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(f"Braid on {TITLES.get(suite.name, suite.name)}: per source and fused")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(report: dict[str, Any], suite: Suite, name: str, results: Path = RESULTS) -> list[Path]:
    md = write_results(name, markdown(report, suite), report, results=results)
    png = results / f"{name}.png"
    plot(report, suite, png)
    return [md, results / f"{name}.json", png]


def main() -> None:
    """``python -m benchmarks.quality.suites.report NAME``: write ``NAME.md`` and
    ``.png`` again from ``benchmarks/results/NAME.json`` (after a report change)."""
    import json
    import sys

    from . import SUITES

    name = sys.argv[1]
    report = json.loads((RESULTS / f"{name}.json").read_text())
    suite = SUITES[report["suite"]](Path(report["data"]), 0)
    write_outputs(report, suite, name)


if __name__ == "__main__":
    main()
