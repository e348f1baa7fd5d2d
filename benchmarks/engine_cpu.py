"""A fused recall's CPU without HTTP, two source trees compared turn by turn on one stack.

``python -m benchmarks.engine_cpu <home> [--size N] [--recalls R] [--turns T] [--concurrency C]
[--against TREE] [--set KEY=VALUE ...] [--against-set KEY=VALUE ...] [--name X]``
attaches to the stack a load run started in ``home`` (``/tmp/braid-load-*``,
its writes paused as for :mod:`benchmarks.load.probe`). Each side gets a
worker process that opens a Braid runtime on the stack's Postgres and
Typesense with the stack's config, as :mod:`benchmarks.recall_cpu` does:
this tree, and ``TREE`` (a ``git worktree`` of another commit) with
``--against``; ``--set`` and ``--against-set`` override the config of each
(dotted keys as :mod:`benchmarks.quality` takes them; ``--against-set``
alone compares this tree with itself under other settings). Its recalls
are the load's first ``R`` queries as fused recalls, ``C`` in flight (one
at a time by default, as a service with one client sees them; 8 as the
load's 8-client rows), vectors supplied, ``track`` off and one
``reference_time`` (:data:`_BODY`).
Each worker warms up :data:`WARMUP` passes (and loads the tenant's graph
into its copy), then settles its heap and sets its collector as a serving
process does (``service.app``) and waits. The workers then take ``T``
turns each, in alternating order (AB, BA, ...): one pass over the ``R``
recalls while the other waits, timed as CPU ms per recall of that worker
(the engine, its sources, fusion and the block), of Postgres and of
Typesense. This machine's speed drifts by tens of percent within minutes,
so only passes run side by side compare: the report gives each side's
median and the median of the turns' ratios. Each worker hashes its last
pass' answers (the items' ids and scores to the bit, and the block):
equal hashes mean both sides answer alike.

Report: ``benchmarks/results/engine-cpu[-<name>].{md,json}``. Last line:
``engine-cpu: recalls=<r> ms=<median> postgres_ms=<x> typesense_ms=<x> [against_ms=<x> against_postgres_ms=<x> against_typesense_ms=<x> ratio=<median of ms / against_ms>] same_answers=<bool>``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, Any

from benchmarks.common import ROOT, write_results

__all__ = ["markdown", "summary_line", "warm_runtime"]

#: Warm-up passes of each worker before its turns.
WARMUP = 2
#: What every recall sends besides its query and vector: no recall changes the
#: usage counts the next one ranks by, and "now" of the time-based factors is
#: the same in every process (so that two trees' answers compare to the bit).
_BODY = {"track": False, "reference_time": "2026-06-01T00:00:00Z"}
#: How long the warm-up waits at most for the tenant's graph to be loaded.
GRAPH_LOAD_S = 120.0
#: A worker's answers are the lines of its output that start with this.
_ANSWER = "engine-cpu-answer "


def _say(answer: dict[str, Any]) -> None:
    print(_ANSWER + json.dumps(answer), flush=True)


@asynccontextmanager
async def warm_runtime(
    home: Path, size: int, seed: int, recalls: int, sets: list[str], *, prog: str
) -> AsyncIterator[tuple[Any, list[Any], Any]]:
    """A Braid runtime's engine on the paused stack in ``home``, with the
    stack's config (``sets`` applied), the load's first ``recalls`` queries
    as fused recall options (:data:`_BODY`) and the stack's handle: warmed
    up :data:`WARMUP` passes (the tenant's graph loaded into its copy), then
    the heap settled and the collector set as ``python -m service`` does.
    BLAS is held to one thread first, as the service holds it."""
    import msgspec
    import yaml

    from benchmarks.load.corpus import BIG_TENANT, build_corpus
    from benchmarks.load.probe import attach
    from benchmarks.quality.tuning import apply_sets, parse_set
    from config.holder import ConfigHolder
    from config.loader import parse_config
    from indexers.runtime import Backends, open_runtime
    from service.__main__ import one_blas_thread
    from service.app import GEN0_THRESHOLD
    from service.schemas import RecallIn
    from service.validate import recall_options

    one_blas_thread()
    svc = attach(home)
    text = (home / "braid.yaml").read_text()
    if sets:
        text = yaml.safe_dump(apply_sets(yaml.safe_load(text), [parse_set(s) for s in sets]))
    cfg = parse_config(text)
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
    if len(options) < recalls:
        raise SystemExit(f"{prog}: the corpus has {len(options)} queries, fewer than --recalls {recalls}")
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
        yield engine, options, svc


async def _worker(home: Path, size: int, seed: int, recalls: int, concurrency: int, sets: list[str]) -> None:
    """A worker with the tree on ``sys.path``: ready once warm, then a timed
    pass for each ``pass`` line on its input, its answers' hash at ``done``."""
    from benchmarks.common import CpuMeter
    from benchmarks.load.corpus import BIG_TENANT

    async with warm_runtime(home, size, seed, recalls, sets, prog="engine-cpu") as (engine, options, svc):
        meter = CpuMeter(svc.processes)
        answers: list[Any] = []
        _say({"ready": True})
        # Blocking on purpose: while the other side runs its pass, this
        # runtime's background work (outbox polls, flushes) waits too, so no
        # Postgres or Typesense CPU of this side is metered in the other's pass.
        for line in sys.stdin:
            if line.strip() != "pass":
                break
            before, start = meter(), time.process_time()
            if concurrency == 1:
                answers = [await engine.recall(BIG_TENANT, opts) for opts in options]
            else:
                gate = asyncio.Semaphore(concurrency)

                async def recall(opts: Any) -> Any:
                    async with gate:
                        return await engine.recall(BIG_TENANT, opts)

                answers = list(await asyncio.gather(*(recall(opts) for opts in options)))
            after, spent = meter(), time.process_time() - start
            _say(
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
    _say({"items": sum(len(a.items) for a in answers), "digest": digest.hexdigest()})


class _Worker:
    """A worker process of ``tree``, driven a line at a time."""

    def __init__(self, tree: Path, args: argparse.Namespace, sets: list[str]) -> None:
        self.tree = tree
        self.label = str(tree) + "".join(f" {s}" for s in sets)
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), str(args.home), "--size", str(args.size)]
            + ["--seed", str(args.seed), "--recalls", str(args.recalls), "--concurrency", str(args.concurrency)]
            + ["--worker"]
            + [f"--set={s}" for s in sets],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def answer(self) -> dict[str, Any]:
        out: IO[str] | None = self.proc.stdout
        assert out is not None
        for line in out:
            if line.startswith(_ANSWER):
                result: dict[str, Any] = json.loads(line[len(_ANSWER) :])
                return result
        raise RuntimeError(f"engine-cpu: the worker of {self.label} ended (exit {self.proc.wait()})")

    def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.answer()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def _median(turns: list[dict[str, Any]], tree: str, kind: str) -> float:
    return statistics.median(t[kind] for t in turns if t["tree"] == tree)


def _turn_ratio(turns: list[dict[str, Any]], mine: str, other: str) -> float:
    """The median over the turns of this side's engine CPU over the other's
    (each turn measures both, so each ratio compares passes run together)."""
    by_turn: dict[int, dict[str, float]] = {}
    for t in turns:
        by_turn.setdefault(t["turn"], {})[t["tree"]] = t["engine"]
    return statistics.median(pair[mine] / pair[other] for pair in by_turn.values())


def _in_flight(concurrency: int) -> str:
    return "one at a time" if concurrency == 1 else f"{concurrency} in flight"


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# A fused recall's CPU without HTTP (trees turn by turn)",
        "",
        f"Command: `{report['command']}`  ",
        f"Stack: a paused `benchmarks.load --size {report['size']}` run's Postgres and Typesense; "
        f"{report['recalls']} of its queries as fused recalls, vectors supplied, `track` off, "
        f"{_in_flight(report.get('concurrency', 1))}. "
        f"Each tree's worker warmed up {WARMUP} passes (and loaded the tenant's graph), then took its turns "
        "in alternating order, the other waiting: CPU ms per recall of that worker (engine, sources, fusion, "
        "block), of Postgres and of Typesense, a pass each turn.",
        "",
        "| turn | tree | this process | Postgres | Typesense |",
        "|---|---|---|---|---|",
    ]
    for t in report["turns"]:
        lines.append(
            f"| {t['turn']} | `{t['tree']}` | {t['engine']:.2f} | {t['postgres']:.2f} | {t['typesense']:.2f} |"
        )
    m = report["medians"]
    lines += [
        "",
        f"Medians (`{report['tree']}`): this process **{m['engine']:.2f} ms**, Postgres {m['postgres']:.2f}, "
        f"Typesense {m['typesense']:.2f}; answers' SHA-256 `{report['digests'][report['tree']][:16]}`.",
    ]
    if report.get("against") is not None:
        a = report["against_medians"]
        lines += [
            f"Against (`{report['against']}`): this process **{a['engine']:.2f} ms**, Postgres {a['postgres']:.2f}, "
            f"Typesense {a['typesense']:.2f}; answers' SHA-256 `{report['digests'][report['against']][:16]}`.",
            f"Median of the turns' ratios (this process, this tree / that one): **{report['ratio']:.3f}**. "
            f"The same answers: {'yes' if report['same_answers'] else '**no**'}.",
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
            f" against_typesense_ms={a['typesense']:.2f} ratio={report['ratio']:.3f}"
        )
    return line + f" same_answers={str(report['same_answers']).lower()}"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine_cpu", description=__doc__)
    parser.add_argument("home", type=Path, help="the load run's home (/tmp/braid-load-*)")
    parser.add_argument("--size", type=int, default=10000, help="the load run's --size")
    parser.add_argument("--seed", type=int, default=7, help="the load run's --seed")
    parser.add_argument("--recalls", type=int, default=100, help="fused recalls a pass")
    parser.add_argument("--turns", type=int, default=10, help="timed passes of each tree")
    parser.add_argument("--concurrency", type=int, default=1, help="recalls in flight in a pass")
    parser.add_argument("--against", type=Path, default=None, help="another source tree, measured turn by turn")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a config override for this tree's worker"
    )
    parser.add_argument(
        "--against-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for the other worker (alone: this tree again, with these overrides)",
    )
    parser.add_argument("--name", default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        asyncio.run(_worker(args.home, args.size, args.seed, args.recalls, args.concurrency, args.set))
        return
    if args.recalls < 1 or args.turns < 1 or args.concurrency < 1:
        parser.error("--recalls, --turns and --concurrency must be at least 1")
    if args.against is not None and args.against.resolve() == ROOT and args.set == args.against_set:
        parser.error("--against names this tree with the same settings: the two sides would be one")
    workers = [_Worker(ROOT, args, args.set)]
    if args.against is not None or args.against_set:
        other_tree = ROOT if args.against is None else args.against.resolve()
        workers.append(_Worker(other_tree, args, args.against_set))
    turns: list[dict[str, Any]] = []
    digests: dict[str, str] = {}
    try:
        for w in workers:
            w.answer()
            print(f"engine-cpu: {w.label} ready", flush=True)
        for turn in range(args.turns):
            for w in workers if turn % 2 == 0 else workers[::-1]:
                turns.append({"turn": turn, "tree": w.label, **w.ask("pass")})
                print(f"engine-cpu: turn {turn} {w.label}: {turns[-1]['engine']:.2f} ms", flush=True)
        for w in workers:
            digests[w.label] = w.ask("done")["digest"]
    finally:
        for w in workers:
            w.stop()
    kinds = ("engine", "postgres", "typesense")
    mine, other = workers[0].label, (workers[1].label if len(workers) > 1 else None)
    report: dict[str, Any] = {
        "command": "python -m benchmarks.engine_cpu " + " ".join(sys.argv[1:]),
        "size": args.size,
        "recalls": args.recalls,
        "concurrency": args.concurrency,
        "tree": mine,
        "medians": {k: _median(turns, mine, k) for k in kinds},
        "against": other,
        "against_medians": {k: _median(turns, other, k) for k in kinds} if other else None,
        "ratio": _turn_ratio(turns, mine, other) if other else None,
        "same_answers": len(set(digests.values())) == 1,
        "digests": digests,
        "turns": turns,
    }
    name = "engine-cpu" + (f"-{args.name}" if args.name else "")
    print(f"engine-cpu: report at {write_results(name, markdown(report), report)}")
    print(summary_line(report))


if __name__ == "__main__":
    main()
