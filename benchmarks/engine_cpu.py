"""A fused recall's CPU without HTTP, two source trees compared in turn on one stack.

``python -m benchmarks.engine_cpu <home> [--size N] [--recalls R] [--rounds K] [--against TREE] [--name X]``
attaches to the stack a load run started in ``home`` (``/tmp/braid-load-*``,
its writes paused as for :mod:`benchmarks.load.probe`). Each measurement is
a fresh process that opens a Braid runtime of this tree (or of ``TREE``, a
``git worktree`` of another commit) on the stack's Postgres and Typesense
with the stack's config, as :mod:`benchmarks.recall_cpu` does, and sends
the load's first ``R`` queries as fused recalls, one at a time, with their
vectors supplied, ``track`` off and one ``reference_time`` (:data:`_BODY`). After two warm-up passes (and the tenant's
graph loaded into the process' copy), its heap settled and its
collector set as a serving process' (``service.app``), it times three passes: CPU ms per
recall of that process (the engine, its sources, fusion and the block),
of Postgres and of Typesense. With ``--against``, each of ``K`` rounds
measures this tree and then that one: the machine's speed drifts, so only
figures measured in turn compare. Each process hashes its last pass'
answers (the items' ids and scores to the bit, and the block): equal hashes
mean both trees answer alike.

Report: ``benchmarks/results/engine-cpu[-<name>].{md,json}``. Last line:
``engine-cpu: recalls=<r> ms=<median> postgres_ms=<x> typesense_ms=<x> [against_ms=<x> against_postgres_ms=<x> against_typesense_ms=<x>] same_answers=<bool>``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, tree_worker, write_results

__all__ = ["markdown", "summary_line"]

#: Passes timed after the warm-up, and the warm-up's.
PASSES = 3
WARMUP = 2
#: What every recall sends besides its query and vector: no recall changes the
#: usage counts the next one ranks by, and "now" of the time-based factors is
#: the same in every process (so that two trees' answers compare to the bit).
_BODY = {"track": False, "reference_time": "2026-06-01T00:00:00Z"}
#: How long the warm-up waits at most for the tenant's graph to be loaded.
GRAPH_LOAD_S = 120.0


async def _worker(home: Path, size: int, seed: int, recalls: int) -> dict[str, Any]:
    """One measurement in this process, with the tree on ``sys.path``."""
    import msgspec

    from benchmarks.common import CpuMeter
    from benchmarks.load.corpus import BIG_TENANT, build_corpus
    from benchmarks.load.probe import attach
    from config.holder import ConfigHolder
    from config.loader import parse_config
    from indexers.runtime import Backends, open_runtime
    from service.__main__ import one_blas_thread
    from service.app import GEN0_THRESHOLD
    from service.schemas import RecallIn
    from service.validate import recall_options

    one_blas_thread()
    svc = attach(home)
    cfg = parse_config((home / "braid.yaml").read_text())
    corpus = build_corpus(size, seed=seed)
    backends = Backends(
        postgres_dsn=svc.postgres_dsn(),
        typesense_nodes=(f"http://127.0.0.1:{svc.typesense_port()}",),
        typesense_api_key=svc.ts_key,
    )
    options = [
        recall_options(msgspec.convert({**_BODY, "query": q["text"], "embedding": v.tolist()}, RecallIn), cfg)
        for q, v in list(zip(corpus.queries, corpus.query_vectors, strict=True))[:recalls]
    ]
    meter = CpuMeter(svc.processes)
    async with open_runtime(ConfigHolder(cfg), backends) as rt:
        engine = rt.engine
        graph = getattr(engine.sources.get("graph"), "cache", None)
        deadline = time.monotonic() + GRAPH_LOAD_S
        for turn in range(WARMUP):
            for opts in options:
                await engine.recall(BIG_TENANT, opts)
            # The graph source walks in Postgres until the process' copy is loaded.
            while turn == 0 and graph is not None and graph.get(BIG_TENANT) is None and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
        # The heap as a serving process holds it (service.app: settle_heap).
        gc.collect()
        gc.freeze()
        gc.set_threshold(GEN0_THRESHOLD, *gc.get_threshold()[1:])
        used: list[dict[str, float]] = []
        for _ in range(PASSES):
            before, start = meter(), time.process_time()
            answers = [await engine.recall(BIG_TENANT, opts) for opts in options]
            after, spent = meter(), time.process_time() - start
            used.append(
                {
                    "engine": spent * 1000 / recalls,
                    "postgres": (after["postgres"] - before["postgres"]) * 1000 / recalls,
                    "typesense": (after["typesense"] - before["typesense"]) * 1000 / recalls,
                }
            )
    digest = hashlib.sha256()
    for answer in answers:
        for item in answer.items:
            digest.update(f"{item.id}\0{item.score!r}\n".encode())
        digest.update(answer.block.encode() + b"\0")
    return {"passes": used, "items": sum(len(a.items) for a in answers), "digest": digest.hexdigest()}


def _measure(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    """A worker process for ``tree``: its answer."""
    result = tree_worker(
        tree,
        Path(__file__).resolve(),
        [str(args.home), "--size", str(args.size), "--seed", str(args.seed), "--recalls", str(args.recalls)],
    )
    shown = " / ".join(f"{p['engine']:.2f}" for p in result["passes"])
    print(f"engine-cpu: {tree}: {shown} ms", flush=True)
    return result


def _median(runs: list[dict[str, Any]], kind: str) -> float:
    return statistics.median(p[kind] for r in runs for p in r["passes"])


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# A fused recall's CPU without HTTP (trees in turn)",
        "",
        f"Command: `{report['command']}`  ",
        f"Stack: a paused `benchmarks.load --size {report['size']}` run's Postgres and Typesense; "
        f"{report['recalls']} of its queries as fused recalls, vectors supplied, `track` off, one at a time. "
        f"Each process warms up {WARMUP} passes (and loads the tenant's graph), then times {PASSES} passes: "
        "CPU ms per recall of that process (engine, sources, fusion, block), of Postgres and of Typesense.",
        "",
        "| round | tree | this process, each pass | Postgres | Typesense | answers' SHA-256 |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        cells = [" / ".join(f"{p[kind]:.2f}" for p in r["passes"]) for kind in ("engine", "postgres", "typesense")]
        lines.append(f"| {r['round']} | `{r['tree']}` | {' | '.join(cells)} | `{r['digest'][:16]}` |")
    m = report["medians"]
    lines += [
        "",
        f"Medians (`{report['tree']}`): this process **{m['engine']:.2f} ms**, Postgres {m['postgres']:.2f}, "
        f"Typesense {m['typesense']:.2f}.",
    ]
    if report.get("against") is not None:
        a = report["against_medians"]
        lines += [
            f"Against (`{report['against']}`): this process **{a['engine']:.2f} ms**, Postgres {a['postgres']:.2f}, "
            f"Typesense {a['typesense']:.2f}. The same answers: {'yes' if report['same_answers'] else '**no**'}."
        ]
    return "\n".join(lines) + "\n"


def summary_line(report: dict[str, Any]) -> str:
    m = report["medians"]
    line = (
        f"engine-cpu: recalls={report['recalls']} ms={m['engine']:.2f} postgres_ms={m['postgres']:.2f}"
        f" typesense_ms={m['typesense']:.2f}"
    )
    if report.get("against") is not None:
        a = report["against_medians"]
        line += (
            f" against_ms={a['engine']:.2f} against_postgres_ms={a['postgres']:.2f}"
            f" against_typesense_ms={a['typesense']:.2f}"
        )
    return line + f" same_answers={str(report['same_answers']).lower()}"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine_cpu", description=__doc__)
    parser.add_argument("home", type=Path, help="the load run's home (/tmp/braid-load-*)")
    parser.add_argument("--size", type=int, default=10000, help="the load run's --size")
    parser.add_argument("--seed", type=int, default=7, help="the load run's --seed")
    parser.add_argument("--recalls", type=int, default=200, help="fused recalls a pass")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", type=Path, default=None, help="another source tree, measured in turn")
    parser.add_argument("--name", default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(asyncio.run(_worker(args.home, args.size, args.seed, args.recalls))))
        return
    if args.recalls < 1 or args.rounds < 1:
        parser.error("--recalls and --rounds must be at least 1")
    trees = [ROOT] + ([args.against.resolve()] if args.against is not None else [])
    runs = [{"round": turn, **_measure(tree, args)} for turn in range(args.rounds) for tree in trees]
    mine = [r for r in runs if r["tree"] == str(ROOT)]
    other = [r for r in runs if r["tree"] != str(ROOT)]
    kinds = ("engine", "postgres", "typesense")
    report: dict[str, Any] = {
        "command": "python -m benchmarks.engine_cpu " + " ".join(sys.argv[1:]),
        "size": args.size,
        "recalls": args.recalls,
        "tree": str(ROOT),
        "medians": {k: _median(mine, k) for k in kinds},
        "against": None if not other else str(trees[1]),
        "against_medians": {k: _median(other, k) for k in kinds} if other else None,
        "same_answers": len({r["digest"] for r in runs}) == 1,
        "runs": runs,
    }
    name = "engine-cpu" + (f"-{args.name}" if args.name else "")
    print(f"engine-cpu: report at {write_results(name, markdown(report), report)}")
    print(summary_line(report))


if __name__ == "__main__":
    main()
