"""The Markdown report, JSON dump and recall@k plot of one quality run."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, pyplot, write_results

__all__ = ["REFERENCE", "summary_line", "targets", "write_outputs"]

#: shared/data/locomo/README.md: plain "Speaker: text", exact search, no tuning.
REFERENCE = {
    "BM25 (rank_bm25, Okapi defaults)": {"R@5": 0.449, "R@10": 0.523, "R@20": 0.603, "nDCG@10": 0.388},
    "all-MiniLM-L6-v2 cosine": {"R@5": 0.400, "R@10": 0.501, "R@20": 0.600, "nDCG@10": 0.338},
    "RRF k=60 of the two": {"R@5": 0.482, "R@10": 0.574, "R@20": 0.636, "nDCG@10": 0.409},
}
CATEGORIES = {"1": "multi-hop", "2": "temporal", "3": "open-domain", "4": "single-hop"}
METRICS = ("R@5", "R@10", "R@20", "nDCG@10")
SINGLE = ("typesense", "pgvector", "graph")
NAIVE = {"bm25": "BM25 (k1 1.5, b 0.75)", "minilm": "all-MiniLM-L6-v2 cosine", "rrf": "RRF k=60 of the two"}
#: Overall R@10 each source alone must reach: the naive retriever of its kind (README).
SOURCE_FLOORS = {"typesense": 0.523, "pgvector": 0.501}


def _f(x: float) -> str:
    return "–" if math.isnan(x) else f"{x:.3f}"


def best_single(report: dict[str, Any]) -> tuple[str, float]:
    configs = report["configs"]
    name = max((n for n in SINGLE if n in configs), key=lambda n: configs[n]["overall"]["R@10"])
    return name, configs[name]["overall"]["R@10"]


def summary_line(report: dict[str, Any]) -> str:
    fused = report["configs"]["fused"]["overall"]
    name, r10 = best_single(report)
    return f"quality: fused R@10={fused['R@10']:.3f} nDCG@10={fused['nDCG@10']:.3f} best_single R@10={r10:.3f} ({name})"


def targets(report: dict[str, Any]) -> list[tuple[bool | None, str]]:
    """``(passed, what)`` per target; ``None`` when it could not be checked."""
    configs = report["configs"]
    fused = configs["fused"]
    r10, ndcg = fused["overall"]["R@10"], fused["overall"]["nDCG@10"]
    name, single = best_single(report)
    graph = configs["graph"]["overall"]["R@10"] if "graph" in configs else math.nan
    # Issue 17's targets for LoCoMo (plain turns), then the earlier floors.
    checks: list[tuple[bool | None, str]] = [
        (r10 >= 0.80, f"fused R@10 {_f(r10)} >= 0.800"),
        (r10 >= single + 0.03, f"fused R@10 {_f(r10)} >= best single ({name}) {_f(single)} + 0.03"),
        (None if math.isnan(graph) else graph >= 0.60, f"graph R@10 {_f(graph)} >= 0.600"),
        (ndcg >= 0.55, f"fused nDCG@10 {_f(ndcg)} >= 0.550"),
    ]
    naive = report.get("naive")
    for cat, c in fused["by_category"].items():
        what = f"category {cat} {CATEGORIES.get(cat, '')}: fused R@10 {_f(c['R@10'])} >= naive RRF"
        if naive is None:
            checks.append((None, f"{what} (not computed: --no-naive)"))
        else:
            floor = naive["rrf"]["by_category"][cat]["R@10"]
            checks.append((c["R@10"] >= floor, f"{what} {_f(floor)}"))
    for source, floor in SOURCE_FLOORS.items():
        got = configs[source]["overall"]["R@10"]
        checks.append((got >= floor, f"{source} R@10 {_f(got)} >= {floor:.3f}"))
    return checks


def markdown(report: dict[str, Any]) -> str:
    convs = report["conversations"]
    configs = report["configs"]
    n_questions = sum(c["questions"] for c in convs)
    dropped = [
        f"{c['id']}: {', '.join(repr(d) for d in c['dropped_evidence'])}" for c in convs if c["dropped_evidence"]
    ]
    unscored = sum(c["unscored"] for c in convs)
    w = report["write"]
    lines = [
        "# Retrieval quality on LoCoMo (through the HTTP API)",
        "",
        f"Command: `{report['command']}`  ",
        f"Data: `{report['data']}`; mapping options: {report['options']}  ",
        f"Corpus: {len(convs)} conversations, one tenant each; {w['memories']} turns as `session` memories "
        f"({_per_conv(convs, 'turns')}).  ",
        f"Questions: {n_questions} of categories 1-4 "
        f"({_per_conv(convs, 'questions')}); "
        f"{unscored} left unscored for having no evidence; {report['scored']} asked.  ",
        "Evidence normalized (`D8:6; D9:17` is two ids, `D:11:26` is `D11:26`); "
        f"entries naming no turn dropped: {'; '.join(dropped) or 'none'}.  ",
        f"Each recall: `top_k` 20, `budget_tokens` 65536, `min_confidence` 0, {report['concurrency']} in flight.  ",
        f"Run time {report['elapsed_s']:.0f} s: service start {report['startup_s']:.0f} s, writes "
        f"{w['write_s']:.0f} s ({w['per_s']:.0f} memories/s), outbox drain wait {w['sync_wait_s']:.1f} s.",
        "",
        "## Overall",
        "",
        "| config | R@5 | R@10 | R@20 | nDCG@10 | empty answers | degraded |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, c in configs.items():
        o = c["overall"]
        lines.append(f"| {name} | {' | '.join(_f(o[m]) for m in METRICS)} | {c['empty']} | {c['degraded']} |")
    lines += ["", "Reference (shared/data/locomo/README.md; exact search, no tuning):", ""]
    lines += ["| retriever | R@5 | R@10 | R@20 | nDCG@10 |", "|---|---|---|---|---|"]
    for name, ref in REFERENCE.items():
        lines.append(f"| {name} | {' | '.join(_f(ref[m]) for m in METRICS)} |")

    cats = sorted({k for c in configs.values() for k in c["by_category"]})
    if naive := report.get("naive"):
        lines += [
            "",
            f"Naive reference, computed in this run ({report['naive_s']:.0f} s; the same questions; "
            "plain `Speaker: text` turns, exact search, no dates):",
            "",
            "| retriever | " + " | ".join([*METRICS, *(f"R@10 {k} {CATEGORIES.get(k, '')}" for k in cats)]) + " |",
            "|---|" + "---|" * (len(METRICS) + len(cats)),
        ]
        for key, label in NAIVE.items():
            n = naive[key]
            lines.append(
                f"| {label} | {' | '.join(_f(n['overall'][m]) for m in METRICS)} | "
                + " | ".join(_f(n["by_category"][k]["R@10"]) for k in cats)
                + " |"
            )
    factors = configs["fused"].get("factors", {})
    lines += [
        "",
        f"Fused recalls with a ranking factor applied to any item (of {report['scored']}): "
        + ", ".join(f"{f} {factors.get(f, 0)}" for f in sorted({"speaker", "time", *factors}))
        + ".",
    ]

    if ceiling := report.get("ceilings"):
        lines += [
            "",
            f"Ceilings (`benchmarks/quality/ceilings.py`): an oracle picking the best single source per question "
            f"R@10 {_f(ceiling['oracle R@10'])}; the union of the three top-10s (up to 30 memories) "
            f"R {_f(ceiling['union R@10'])}; fused R@10 {_f(configs['fused']['overall']['R@10'])}.",
        ]
    lines += ["", "## Targets", ""]
    for passed, what in targets(report):
        lines.append(f"- {'PASS' if passed else 'not checked' if passed is None else '**FAIL**'}: {what}")
    lines += ["", "## R@10 per category", ""]
    lines.append(
        "| config | " + " | ".join(f"{k} {CATEGORIES.get(k, '')} (n={_count(configs, k)})" for k in cats) + " |"
    )
    lines.append("|---|" + "---|" * len(cats))
    for name, c in configs.items():
        lines.append(f"| {name} | " + " | ".join(_f(c["by_category"][k]["R@10"]) for k in cats) + " |")
    lines += ["", "## nDCG@10 per category", ""]
    lines.append("| config | " + " | ".join(f"{k} {CATEGORIES.get(k, '')}" for k in cats) + " |")
    lines.append("|---|" + "---|" * len(cats))
    for name, c in configs.items():
        lines.append(f"| {name} | " + " | ".join(_f(c["by_category"][k]["nDCG@10"]) for k in cats) + " |")

    cold = report["cold_embedding_ms"]
    lines += [
        "",
        "## Recall latency",
        "",
        f"Client-side, {report['concurrency']} recalls in flight, query embeddings already cached "
        f"(a warm-up pass computed them: p50 {cold['p50']:.1f} ms, p95 {cold['p95']:.1f} ms per query).",
        "",
        "| config | p50 ms | p95 ms | recalls/s | per-source p50 ms (server) |",
        "|---|---|---|---|---|",
    ]
    for name, c in configs.items():
        src = ", ".join(f"{k} {v:.1f}" for k, v in c["source_ms_p50"].items())
        lat = c["latency_ms"]
        lines.append(f"| {name} | {lat['p50']:.1f} | {lat['p95']:.1f} | {c['recalls_per_s']:.0f} | {src} |")
    if sweep := report.get("sweep"):
        lines += ["", "## Sweep (fused, `track` false, after one ingestion)", ""]
        lines += [f"| set | {' | '.join(METRICS)} | degraded |", "|---|" + "---|" * (len(METRICS) + 1)]
        for row in sweep:
            o = row["score"]["overall"]
            lines.append(f"| {row['name']} | {' | '.join(_f(o[m]) for m in METRICS)} | {row['score']['degraded']} |")
        lines += _sweep_sources(sweep)
    lines += ["", f"`{summary_line(report)}`", ""]
    return "\n".join(lines)


def _sweep_sources(sweep: list[dict[str, Any]]) -> list[str]:
    """The sweep's rows with every source alone and the ceilings (``--sweep-sources``)."""
    rows = [r for r in sweep if "configs" in r["score"]]
    if not rows:
        return []
    lines = [
        "",
        "Each source alone under each set, and the ceilings (R@10; union: R over the three top-10s):",
        "",
        "| set | typesense | pgvector | graph | fused | fused - best single | oracle | union | per category (fused) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        s = row["score"]
        singles = [s["configs"][n]["R@10"] for n in SINGLE]
        fused = s["overall"]["R@10"]
        cats = ", ".join(f"{k} {_f(v['R@10'])}" for k, v in s["by_category"].items())
        lines.append(
            f"| {row['name']} | {' | '.join(_f(v) for v in singles)} | {_f(fused)} | {fused - max(singles):+.3f} "
            f"| {_f(s['ceilings']['oracle R@10'])} | {_f(s['ceilings']['union R@10'])} | {cats} |"
        )
    return lines


def _per_conv(convs: list[dict[str, Any]], key: str) -> str:
    return ", ".join(f"{c['id']}: {c[key]}" for c in convs)


def _count(configs: dict[str, Any], cat: str) -> int:
    return int(next(iter(configs.values()))["by_category"][cat]["questions"])


def plot(report: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, c in report["configs"].items():
        curve = c["curve"]
        ax.plot(range(1, len(curve) + 1), curve, marker=".", label=name, linewidth=2.2 if name == "fused" else 1.4)
    if naive := report.get("naive"):
        curve = naive["rrf"]["curve"]
        ax.plot(
            range(1, len(curve) + 1), curve, color="grey", linestyle="--", linewidth=1, label="naive RRF (this run)"
        )
    ax.axhline(
        REFERENCE["RRF k=60 of the two"]["R@10"],
        color="grey",
        linestyle=":",
        linewidth=1,
        label="reference RRF R@10 (0.574)",
    )
    ax.set_xlabel("k")
    ax.set_ylabel("evidence recall@k")
    ax.set_xticks(range(1, 21))
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.set_title("Braid on LoCoMo: evidence recall@k per source and fused")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(report: dict[str, Any], name: str = "quality", results: Path = RESULTS) -> list[Path]:
    md = write_results(name, markdown(report), report, results=results)
    png = results / f"{name}.png"
    plot(report, png)
    return [md, results / f"{name}.json", png]
