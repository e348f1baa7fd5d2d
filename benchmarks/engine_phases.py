"""Where a fused recall's CPU goes in the engine, phase by phase, on a paused load stack.

``python -m benchmarks.engine_phases <home> [--size N] [--seed S] [--recalls R] [--passes P] [--set k=v ...] [--name X]``
attaches to the stack a load run started in ``home`` (``/tmp/braid-load-*``,
its writes paused as for :mod:`benchmarks.load.probe`), opens a Braid
runtime on it with the stack's config (``--set`` overrides applied) in this process (on uvloop, as
``python -m service`` runs; BLAS on one thread, the heap settled and the
collector set as a serving process has them) and asks the load's first
``R`` queries as fused recalls (vectors supplied, ``track`` off), one at a
time, ``P`` passes after :data:`WARMUP`.

Each phase's CPU (this process' ``time.process_time``) is summed over a
pass by wrapping the functions named in :data:`PHASES`: the query plan,
each source's search, the live check of Typesense's hits, the fusion, the
factor reads, the block; and inside the graph source its seeds, walk,
PageRank, shares and its Postgres read, inside the Typesense source its
BM25. The sources run one after another here (a recall runs them
concurrently), so that each one's CPU is its own; the read of memories not
yet indexed runs beside them, and its CPU counts to whichever source is
running. ``other`` is the recall's CPU outside the top-level phases. Each
wrapper costs about a microsecond a call: the phases add up to a little
more than a recall without them. For scale, each pass also times
:data:`BARE` bare round trips of each kind this process makes: a
``tenant_reads`` of ``SELECT 1`` to Postgres, and a ``multi_search`` of
``per_page`` 0 to Typesense (``bare.postgres``, ``bare.typesense``: CPU ms
each).

Report: ``benchmarks/results/engine-phases[-<name>].{md,json}``. Last line:
``engine-phases: recalls=<r> ms=<median recall> <phase>=<median ms> ...`` (top-level phases).
"""

from __future__ import annotations

import argparse
import functools
import inspect
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from benchmarks.common import write_results
from benchmarks.engine_cpu import WARMUP, warm_runtime

__all__ = ["PHASES", "Phases", "markdown", "medians", "summary_line", "top_level"]

#: Bare round trips of each kind a pass times.
BARE = 200

#: Phase -> (module, attribute path) of what is timed; a top-level phase has no dot.
PHASES: dict[str, tuple[str, str]] = {
    "plan": ("indexers.engine", "Engine.plan"),
    "live check": ("indexers.engine", "Engine._current_only"),
    "rank": ("indexers.engine", "rank"),
    "usage read": ("indexers.engine", "Engine._usage"),
    "vectors read": ("indexers.engine", "Engine._vectors"),
    "finish": ("fusion.assemble", "Ranking.finish"),
    "graph.seeds": ("indexers.graph_cache", "TenantGraph.seeds"),
    "graph.walk": ("indexers.graph_cache", "TenantGraph.walked"),
    "graph.pagerank": ("indexers.graph", "_pagerank"),
    "graph.shares": ("indexers.graph_cache", "TenantGraph.shares"),
    "graph.read": ("indexers.graph", "GraphSource._ranked_memories"),
    "typesense.bm25": ("indexers.typesense.bm25", "Bm25Plan.scores"),
}


class Phases:
    """CPU seconds summed by phase, and the wrappers that add to them."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}

    def add(self, phase: str, seconds: float) -> None:
        self.spent[phase] = self.spent.get(phase, 0.0) + seconds

    def timed(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` (sync or async) adding its CPU to ``phase`` on every call."""
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def timed_async(*args: Any, **kwargs: Any) -> Any:
                start = time.process_time()
                try:
                    return await fn(*args, **kwargs)
                finally:
                    self.add(phase, time.process_time() - start)

            return timed_async

        @functools.wraps(fn)
        def timed_sync(*args: Any, **kwargs: Any) -> Any:
            start = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(phase, time.process_time() - start)

        return timed_sync

    @contextmanager
    def wrapped(self, owner: Any, attribute: str, phase: str) -> Iterator[None]:
        """``owner.attribute`` timed as ``phase`` while inside."""
        original = owner.__dict__[attribute] if isinstance(owner, type) else getattr(owner, attribute)
        setattr(owner, attribute, self.timed(phase, original))
        try:
            yield
        finally:
            setattr(owner, attribute, original)


def _owner(module: str, path: str) -> tuple[Any, str]:
    target: Any = sys.modules[module]
    *parents, attribute = path.split(".")
    for name in parents:
        target = getattr(target, name)
    return target, attribute


def _sources_in_turn(phases: Phases, search_all: Callable[..., Any]) -> Callable[..., Any]:
    """``indexers.registry.search_all`` running one source at a time, each timed as ``source.<name>``."""

    async def one_by_one(sources: Any, queries: Any, cfg: Any, tracing: Any = None) -> dict[str, Any]:
        results: dict[str, Any] = {}
        for name in queries:
            start = time.process_time()
            results.update(await search_all({name: sources[name]}, {name: queries[name]}, cfg, tracing))
            phases.add(f"source.{name}", time.process_time() - start)
        # The sources asked for nothing, reported as search_all reports them.
        results.update(await search_all({n: s for n, s in sources.items() if n not in queries}, {}, cfg, tracing))
        return results

    return one_by_one


async def _measure(
    home: Path, size: int, seed: int, recalls: int, passes: int, sets: list[str]
) -> list[dict[str, float]]:
    import indexers.engine
    from benchmarks.load.corpus import BIG_TENANT
    from indexers.postgres import Read, tenant_reads

    phases = Phases()
    passes_out: list[dict[str, float]] = []
    async with warm_runtime(home, size, seed, recalls, sets, prog="engine-phases") as (engine, options, _):
        client, alias = engine.sources["typesense"].route(BIG_TENANT)
        bare: dict[str, Callable[[], Any]] = {
            "bare.postgres": lambda: tenant_reads(engine.store.pool, BIG_TENANT, [Read("SELECT 1")]),
            "bare.typesense": lambda: client.multi_search([{"collection": alias, "q": "*", "per_page": 0}]),
        }
        with ExitStack() as stack:
            for phase, (module, path) in PHASES.items():
                owner, attribute = _owner(module, path)
                stack.enter_context(phases.wrapped(owner, attribute, phase))
            # The engine's own name for it (imported from indexers.registry).
            search_all = getattr(indexers.engine, "search_all")  # noqa: B009
            setattr(indexers.engine, "search_all", _sources_in_turn(phases, search_all))  # noqa: B010
            stack.callback(setattr, indexers.engine, "search_all", search_all)
            for n in range(passes):
                phases.spent.clear()
                start = time.process_time()
                for opts in options:
                    await engine.recall(BIG_TENANT, opts)
                spent = {"recall": time.process_time() - start, **phases.spent}
                passes_out.append({phase: seconds * 1000 / recalls for phase, seconds in spent.items()})
                for phase, trip in bare.items():
                    start = time.process_time()
                    for _ in range(BARE):
                        await trip()
                    passes_out[-1][phase] = (time.process_time() - start) * 1000 / BARE
                print(f"engine-phases: pass {n}: {passes_out[-1]['recall']:.2f} ms a recall", flush=True)
    return passes_out


def top_level(phase: str) -> bool:
    """A phase of the recall itself (a source's search is one), not one inside a source."""
    return phase != "recall" and ("." not in phase or phase.startswith("source."))


def medians(passes: list[dict[str, float]]) -> dict[str, float]:
    """Each phase's median over the passes (a phase a pass did not reach counts 0 there),
    with ``other``: the recall's CPU outside the top-level phases."""
    names = sorted({phase for p in passes for phase in p})
    out = {phase: statistics.median(p.get(phase, 0.0) for p in passes) for phase in names}
    out["other"] = statistics.median(p["recall"] - sum(v for k, v in p.items() if top_level(k)) for p in passes)
    return out


def markdown(report: dict[str, Any]) -> str:
    m = report["medians"]
    top = [k for k in m if top_level(k)]
    lines = [
        "# Where a fused recall's CPU goes in the engine, phase by phase",
        "",
        f"Command: `{report['command']}`  ",
        f"Stack: a paused `benchmarks.load --size {report['size']}` run's Postgres and Typesense; "
        f"{report['recalls']} of its queries as fused recalls, vectors supplied, `track` off, one at a time, "
        f"in this process (uvloop); {report['passes']} passes after {WARMUP} warm-up passes. "
        "The sources run one after another (each one's CPU its own); a recall runs them concurrently. "
        "`other`: the recall's CPU outside the phases above it.",
        "",
        "| phase | CPU ms a recall (median of the passes) | share of the recall |",
        "|---|---|---|",
    ]
    for phase in sorted(top, key=lambda k: -m[k]):
        lines.append(f"| {phase} | {m[phase]:.3f} | {m[phase] / m['recall']:.0%} |")
    lines.append(f"| **recall** | **{m['recall']:.3f}** | 100% |")
    lines += [
        "",
        "Inside the sources (CPU ms a recall), and a bare round trip (`bare.*`, CPU ms each):",
        "",
        "| phase | CPU ms |",
        "|---|---|",
    ]
    for phase in sorted(k for k in m if k != "recall" and not top_level(k)):
        lines.append(f"| {phase} | {m[phase]:.3f} |")
    return "\n".join(lines) + "\n"


def summary_line(report: dict[str, Any]) -> str:
    m = report["medians"]
    parts = [f"{k.replace(' ', '_')}={v:.2f}" for k, v in m.items() if top_level(k)]
    return f"engine-phases: recalls={report['recalls']} ms={m['recall']:.2f} " + " ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine_phases", description=__doc__)
    parser.add_argument("home", type=Path, help="the load run's home (/tmp/braid-load-*)")
    parser.add_argument("--size", type=int, default=10000, help="the load run's --size")
    parser.add_argument("--seed", type=int, default=7, help="the load run's --seed")
    parser.add_argument("--recalls", type=int, default=200, help="fused recalls a pass")
    parser.add_argument("--passes", type=int, default=3, help="timed passes")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a config override (dotted YAML key)"
    )
    parser.add_argument("--name", default=None)
    args = parser.parse_args()
    if args.recalls < 1 or args.passes < 1:
        parser.error("--recalls and --passes must be at least 1")
    import uvloop

    passes = uvloop.run(_measure(args.home, args.size, args.seed, args.recalls, args.passes, args.set))
    report = {
        "command": "python -m benchmarks.engine_phases " + " ".join(sys.argv[1:]),
        "size": args.size,
        "recalls": args.recalls,
        "passes": args.passes,
        "medians": medians(passes),
        "per_pass": passes,
    }
    name = "engine-phases" + (f"-{args.name}" if args.name else "")
    print(f"engine-phases: report at {write_results(name, markdown(report), report)}")
    print(summary_line(report))


if __name__ == "__main__":
    main()
