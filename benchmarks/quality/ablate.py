"""Ablation of the fusion stage on LoCoMo: ``python -m benchmarks.quality.ablate``.

Runs the service once with the post-fusion factors off, keeps every
question's three per-source lists (top 100, each item's speaker and day), and
re-fuses them offline under a grid of RRF ``k``, per-source weights and factor
boosts, exactly as the engine does (:func:`fusion.rrf`, then
:func:`fusion.apply_factors`). One service run answers every fusion question
in seconds; what happens inside a source (Typesense's ``vectorWeight``, the
query analysis) stays as configured. Writes
``benchmarks/results/<name>.md`` and prints the best row.

It also reports two ceilings no rank fusion of these lists can pass: the
mean over questions of the best single source's R@10 (an oracle picking the
source per question), and the R@10 of the union of the three top-10s.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import tempfile
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.common import LOCOMO_DATA, ROOT, write_results
from fusion import apply_factors, rrf
from fusion.factors import FactorWeights
from fusion.query import QueryPlan

from .locomo import MappingOptions, load_conversations
from .metrics import mean, ndcg_at_k, recall_at_k
from .run import BUDGET, write_all
from .service import TenantService

SOURCES = ("typesense", "pgvector", "graph")
DEPTH = 100

#: (k, weights of typesense/pgvector/graph, speakerBoost, timeBoost)
GRID = [
    (k, (1.0, wp, wg), sb, tb)
    for k in (20, 60)
    for wp, wg in ((1.0, 0.0), (1.0, 0.3), (1.0, 0.5), (1.0, 1.0), (0.7, 0.3))
    for sb, tb in ((0.0, 0.0), (0.5, 0.0), (0.0, 0.6), (0.5, 0.6), (1.0, 1.0))
]

Item = tuple[str, str | None, str]  # dia_id, speaker, created_at
Row = dict[str, Any]


async def collect(data: Path, config: Path, concurrency: int) -> list[Row]:
    """Per question: its evidence, category, query analysis and source lists."""
    convs = load_conversations(data)
    cfg = yaml.safe_load(config.read_text())
    cfg.setdefault("query", {}).update({"speakerBoost": 0.0, "timeBoost": 0.0})
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "braid.yaml"
        plain.write_text(yaml.safe_dump(cfg, sort_keys=False))
        svc = await asyncio.to_thread(TenantService, [c.tenant for c in convs], plain)
    rows: list[Row] = []
    try:
        async with httpx.AsyncClient(base_url=svc.url, timeout=120) as client:
            await write_all(client, svc, convs, MappingOptions())
            gate = asyncio.Semaphore(concurrency)

            async def ask(conv: Any, q: Any) -> Row:
                row: Row = {"category": q.category, "evidence": q.evidence}
                async with gate:
                    for source in SOURCES:
                        body = {
                            "query": q.text,
                            "top_k": DEPTH,
                            "budget_tokens": BUDGET,
                            "min_confidence": 0,
                            "sources": [source],
                        }
                        r = await client.post("/v1/recall", json=body, headers=svc.headers_by_tenant[conv.tenant])
                        r.raise_for_status()
                        out = r.json()
                        row[source] = [
                            (conv.dia_id(i["id"]), i["speaker"], i["created_at"])
                            for i in out["items"]
                            if conv.dia_id(i["id"]) is not None
                        ]
                        row["plan"] = QueryPlan(
                            text=out["query"]["text"],
                            speakers=tuple(out["query"]["speakers"]),
                            dates=tuple(
                                (date.fromisoformat(a), date.fromisoformat(b)) for a, b in out["query"]["dates"]
                            ),
                        )
                return row

            rows = await asyncio.gather(*(ask(c, q) for c in convs for q in c.questions))
    finally:
        await asyncio.to_thread(svc.stop)
    return rows


def fuse(row: Row, weights: dict[str, float], k: int, speaker_boost: float, time_boost: float) -> list[str]:
    """The engine's fusion and factors over the stored lists."""
    meta = {d: (s, datetime.fromisoformat(t.replace("Z", "+00:00")), None) for src in weights for d, s, t in row[src]}
    fused = rrf({src: [d for d, _, _ in row[src]] for src in weights}, k=k, weights=weights)
    factors = FactorWeights(speaker_boost=speaker_boost, time_boost=time_boost)
    # Recency and importance stay off (FactorWeights' defaults): the reference time is never read.
    ranked = apply_factors(fused, meta, row["plan"], factors, datetime.now(UTC))
    return [s.fused.id for s in ranked]


def score(rows: list[Row], rank: Any) -> dict[str, float]:
    out: dict[str, list[float]] = {"r10": [], "ndcg10": [], **{f"c{c}": [] for c in (1, 2, 3, 4)}}
    for row in rows:
        ranked = rank(row)
        r10 = recall_at_k(ranked, row["evidence"], 10)
        out["r10"].append(r10)
        out["ndcg10"].append(ndcg_at_k(ranked, row["evidence"], 10))
        out[f"c{row['category']}"].append(r10)
    return {key: mean(v) for key, v in out.items()}


def ceilings(rows: list[Row], k: int, speaker_boost: float, time_boost: float) -> dict[str, float]:
    best, union = [], []
    for row in rows:
        tops = {s: fuse(row, {s: 1.0}, k, speaker_boost, time_boost)[:10] for s in SOURCES}
        best.append(max(recall_at_k(t, row["evidence"], 10) for t in tops.values()))
        union.append(recall_at_k(list(itertools.chain(*tops.values())), row["evidence"], 30))
    return {"oracle_best_source": mean(best), "union_of_top10s": mean(union)}


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.quality.ablate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--data", type=Path, default=LOCOMO_DATA)
    parser.add_argument("--config", type=Path, default=ROOT / "config" / "braid.yaml")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--name", default="quality-ablation")
    args = parser.parse_args()
    rows = asyncio.run(collect(args.data, args.config, args.concurrency))

    lines = [
        "# Fusion ablation on LoCoMo (re-fused offline from one service run)",
        "",
        f"Command: `python -m benchmarks.quality.ablate {' '.join(sys.argv[1:])}`  ",
        f"Config: `{args.config}` with the factors off while collecting; {len(rows)} questions; "
        f"per-source lists of up to {DEPTH}. Each row re-fuses them as the engine does.",
        "",
        "| k | weights ts/pg/graph | speakerBoost | timeBoost | typesense R@10 | pgvector R@10 | graph R@10 "
        "| fused R@10 | fused nDCG@10 | margin over best single | c1 | c2 | c3 | c4 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    best_row: tuple[float, str] = (-1.0, "")
    for k, (wt, wp, wg), sb, tb in GRID:
        singles = {s: score(rows, lambda r, s=s: fuse(r, {s: 1.0}, k, sb, tb))["r10"] for s in SOURCES}
        weights = {"typesense": wt, "pgvector": wp, "graph": wg}
        f = score(rows, lambda r: fuse(r, weights, k, sb, tb))
        margin = f["r10"] - max(singles.values())
        line = (
            f"| {k} | {wt}/{wp}/{wg} | {sb} | {tb} | {singles['typesense']:.3f} | {singles['pgvector']:.3f} "
            f"| {singles['graph']:.3f} | {f['r10']:.3f} | {f['ndcg10']:.3f} | {margin:+.3f} "
            f"| {f['c1']:.3f} | {f['c2']:.3f} | {f['c3']:.3f} | {f['c4']:.3f} |"
        )
        lines.append(line)
        best_row = max(best_row, (f["r10"], line))
    for k in (20, 60):
        c = ceilings(rows, k, 0.5, 0.6)
        lines += [
            "",
            f"Ceilings at k={k}, speakerBoost 0.5, timeBoost 0.6: oracle best single source per question "
            f"R@10 {c['oracle_best_source']:.3f}; union of the three top-10s (up to 30 items) "
            f"{c['union_of_top10s']:.3f}.",
        ]
    path = write_results(args.name, "\n".join(lines) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    print("best:", best_row[1])


if __name__ == "__main__":
    main()
