"""The Typesense source's own CPU per search, its answers replayed: Braid's Python alone.

``python -m benchmarks.typesense_source_cpu <home> [--size N] [--queries Q] [--rounds R] [--against TREE] [--name X]``
attaches to the stack a load run started in ``home`` (``/tmp/braid-load-*``,
its writes paused as for :mod:`benchmarks.load.probe`) and builds the
``typesense`` source of the stack's config in a fresh process. Each of the
load's first ``Q`` queries (vectors supplied, pgvector covering the
vectors as in a fused recall) is searched once against the stack's
Typesense, and the bytes of every ``multi_search`` answer are kept; then
the queries are searched twice to warm up, and three times more with the
answers replayed from those bytes (decoded at every search, as the client
decodes them). The figure is that process' CPU per search over the last
three passes: the source's own work on an answer (decoding it, the hits'
checks, BM25 over the candidates, the hits it returns), with no network,
no Typesense and no other source competing for the cores.

With ``--against TREE`` (another checkout, e.g. a ``git worktree`` of an
older commit) each of ``R`` rounds measures this tree and then that one,
each in a process of its own, so the two are compared on the same stack in
turn (the machine's speed drifts). Each process also hashes the hits of its
last pass (ids, scores to the bit, contents, dates): equal hashes mean the
two trees return the same hits.

Report: ``benchmarks/results/typesense-source-cpu[-<name>].{md,json}``.
Last line: ``typesense-source-cpu: queries=<q> ms=<median> [against_ms=<median>] same_hits=<bool>``.
"""

from __future__ import annotations

import argparse
import asyncio
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


async def _worker(home: Path, size: int, queries: int) -> dict[str, Any]:
    """One measurement in this process, with the tree on ``sys.path``."""
    import msgspec

    from benchmarks.load.corpus import BIG_TENANT, build_corpus
    from benchmarks.load.probe import attach
    from config.loader import parse_config
    from indexers.base import SearchQuery
    from indexers.typesense.client import TypesenseClient
    from indexers.typesense.source import TypesenseSource

    svc = attach(home)
    cfg = parse_config((home / "braid.yaml").read_text())
    corpus = build_corpus(size)
    encode = msgspec.json.Encoder().encode
    decode = msgspec.json.Decoder().decode
    client = TypesenseClient([f"http://127.0.0.1:{svc.typesense_port()}"], svc.ts_key)
    source = TypesenseSource(client, cfg.typesense.collection, lambda: cfg, groups=cfg.typesense.groups)
    answers: dict[bytes, bytes] = {}

    async def replayed(bodies: Any) -> list[dict[str, Any]]:
        key = encode(bodies)
        if key not in answers:
            response = await client._request("POST", "/multi_search", json={"searches": list(bodies)})
            answers[key] = response.content
        results: list[dict[str, Any]] = decode(answers[key])["results"]
        return results

    client.multi_search = replayed  # type: ignore[method-assign]
    searches = [
        SearchQuery(
            tenant=BIG_TENANT,
            text=q["text"],
            vector=tuple(v.tolist()),
            limit=max(cfg.search_top_k, cfg.source("typesense").candidates),
            min_confidence=cfg.min_confidence,
            vectors_covered=True,
            model=cfg.embedding.model,
        )
        for q, v in list(zip(corpus.queries, corpus.query_vectors))[:queries]
    ]
    try:
        for _ in range(WARMUP):
            for query in searches:
                await source.search(query)
        used = []
        digest = hashlib.sha256()
        for _ in range(PASSES):
            start = time.process_time()
            hits = [await source.search(query) for query in searches]
            used.append((time.process_time() - start) * 1000 / len(searches))
        for found in hits:
            for h in found:
                digest.update(f"{h.id}\0{h.score!r}\0{h.content}\0{h.created_at.isoformat()}\n".encode())
    finally:
        await client.aclose()
    return {"ms": used, "hits": sum(len(f) for f in hits), "digest": digest.hexdigest()}


def _measure(tree: Path, home: Path, size: int, queries: int) -> dict[str, Any]:
    """A worker process for ``tree``: its answer."""
    result = tree_worker(tree, Path(__file__).resolve(), [str(home), "--size", str(size), "--queries", str(queries)])
    print(f"typesense-source-cpu: {tree}: {' '.join(f'{m:.3f}' for m in result['ms'])} ms", flush=True)
    return result


def _median(runs: list[dict[str, Any]]) -> float:
    return statistics.median(m for r in runs for m in r["ms"])


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# The Typesense source's own CPU per search (answers replayed)",
        "",
        f"Command: `{report['command']}`  ",
        f"Stack: a paused `benchmarks.load --size {report['size']}` run's Typesense; "
        f"{report['queries']} of its queries, vectors supplied, pgvector covering the vectors (a fused recall's "
        "Typesense search). Each process searches them once against Typesense, keeps the answers' bytes, warms "
        f"up {WARMUP} passes, then times {PASSES} passes with the answers replayed (decoded every time): that "
        "process' CPU ms per search, the source's Python alone.",
        "",
        "| round | tree | CPU ms per search, each pass | hits | hits' SHA-256 |",
        "|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        lines.append(
            f"| {r['round']} | `{r['tree']}` | {' / '.join(f'{m:.3f}' for m in r['ms'])} | {r['hits']} "
            f"| `{r['digest'][:16]}` |"
        )
    lines += ["", f"Median: **{report['ms']:.3f} ms** (`{report['tree']}`)"]
    if report.get("against_ms") is not None:
        lines += [
            f" against **{report['against_ms']:.3f} ms** (`{report['against']}`); the same hits: "
            f"{'yes' if report['same_hits'] else '**no**'}."
        ]
    return "\n".join(lines) + "\n"


def summary_line(report: dict[str, Any]) -> str:
    against = f" against_ms={report['against_ms']:.3f}" if report.get("against_ms") is not None else ""
    return (
        f"typesense-source-cpu: queries={report['queries']} ms={report['ms']:.3f}{against} "
        f"same_hits={str(report['same_hits']).lower()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.typesense_source_cpu", description=__doc__)
    parser.add_argument("home", type=Path, help="the load run's home (/tmp/braid-load-*)")
    parser.add_argument("--size", type=int, default=10000, help="the load run's --size")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", type=Path, default=None, help="another source tree, measured in turn")
    parser.add_argument("--name", default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(asyncio.run(_worker(args.home, args.size, args.queries))))
        return
    if args.queries < 1 or args.rounds < 1:
        parser.error("--queries and --rounds must be at least 1")
    trees = [ROOT] + ([args.against.resolve()] if args.against is not None else [])
    runs = []
    for turn in range(args.rounds):
        for tree in trees:
            runs.append({"round": turn, **_measure(tree, args.home, args.size, args.queries)})
    mine = [r for r in runs if r["tree"] == str(ROOT)]
    other = [r for r in runs if r["tree"] != str(ROOT)]
    report: dict[str, Any] = {
        "command": "python -m benchmarks.typesense_source_cpu " + " ".join(sys.argv[1:]),
        "size": args.size,
        "queries": args.queries,
        "tree": str(ROOT),
        "ms": _median(mine),
        "against": None if not other else str(trees[1]),
        "against_ms": _median(other) if other else None,
        "same_hits": len({r["digest"] for r in runs}) == 1,
        "runs": runs,
    }
    name = "typesense-source-cpu" + (f"-{args.name}" if args.name else "")
    print(f"typesense-source-cpu: report at {write_results(name, markdown(report), report)}")
    print(summary_line(report))


if __name__ == "__main__":
    main()
