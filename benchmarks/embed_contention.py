"""Recall latency while bulk writes are being embedded (issue 12, point 5).

Starts ``python -m service`` on the embedded stack (fresh data directory) from
a source tree, loads one 512-memory batch, measures recalls alone, then runs
``--batches`` writes of 512 memories without client embeddings (the service
embeds them), back to back, while recalls arrive at a fixed ``--rate`` (open
loop: a recall is sent on time whether or not the previous one answered, as
agents' turns do), each with a query text of its own so the query cache never
answers. Both trees thus get the same recall load, and their write throughputs
compare.
Reported per tree: recall p50/p95/p99/max during the writes and alone, how
many recalls were degraded (and how many because the query embedding missed
its deadline), the service's ``embedding_ms``, and the write throughput.

Trees: the working tree by default; ``--before REV`` / ``--after REV`` run the
service from a ``git worktree`` of that commit instead (removed after), before
first, back to back; ``--rounds 2`` alternates them (B A B A) to show how much
the shared machine moves the numbers.

Writes ``benchmarks/results/embed-contention.{md,json,png}``. Usage:
``make bench-embed BEFORE=<rev>`` or ``python -m benchmarks.embed_contention --before <rev>``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.common import RESULTS, ROOT, Service, pct, pyplot, write_results

__all__ = ["main", "run_tree", "summarize"]

BATCH = 512

_WORDS = (
    "alex sam maria jordan priya team budget roadmap launch customer invoice design sprint "
    "backlog meeting review deadline postgres typesense vector index query latency release "
    "bug fix deploy kubernetes cluster node memory cache write batch recall graph entity "
    "relation honda civic garden lake painting guitar concert museum hiking trip paris tokyo "
    "berlin coffee tea breakfast dinner birthday wedding doctor dentist school teacher exam "
    "project manager contract lawyer apartment rent moving boxes weekend holiday beach "
    "mountain bicycle marathon training swimming dog cat vet medicine book novel author film "
    "director actor music band album piano lesson language spanish french german course"
).split()


def memory_texts(n: int, rng: random.Random) -> list[str]:
    """``n`` conversation-like turns of 20-35 words."""
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(20, 35))) + "." for _ in range(n)]


def query_texts(n: int, rng: random.Random) -> Iterator[str]:
    """``n`` distinct questions of 5-9 words (never the same text twice: no cache hit)."""
    seen: set[str] = set()
    while len(seen) < n:
        text = "what did we say about " + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 7)))
        if text not in seen:
            seen.add(text)
            yield text


async def _recall(client: httpx.AsyncClient, query: str) -> dict[str, Any]:
    sent = time.monotonic()
    start = time.perf_counter()
    r = await client.post("/v1/recall", json={"query": query})
    ms = (time.perf_counter() - start) * 1000.0
    body = r.json() if r.status_code == 200 else {}
    return {
        "t": sent,
        "ms": ms,
        "status": r.status_code,
        "embedding_ms": body.get("embedding_ms"),
        # Absent before the lanes: the old service had no deadline to miss.
        "embedding_status": body.get("embedding_status"),
        "degraded": body.get("degraded", []),
    }


async def _post_batch(client: httpx.AsyncClient, texts: list[str]) -> dict[str, Any]:
    start = time.monotonic()
    r = await client.post("/v1/memories", json={"memories": [{"content": t} for t in texts]})
    if r.status_code != 201:
        raise RuntimeError(f"write answered {r.status_code}: {r.text[:300]}")
    return {"start": start, "end": time.monotonic()}


async def measure(url: str, headers: dict[str, str], args: argparse.Namespace, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    queries = query_texts(args.idle + 100_000, rng)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300) as client:
        await _post_batch(client, memory_texts(BATCH, rng))  # a corpus to recall from
        idle = [await _recall(client, next(queries)) for _ in range(args.idle)]

        batches = [memory_texts(BATCH, rng) for _ in range(args.batches)]
        writes: list[dict[str, Any]] = []
        recalls: list[dict[str, Any]] = []
        writing = True

        async def writer() -> None:
            nonlocal writing
            try:
                for texts in batches:
                    writes.append(await _post_batch(client, texts))
            finally:
                writing = False

        async def recaller() -> None:
            async def one(query: str) -> None:
                recalls.append(await _recall(client, query))

            tasks: list[asyncio.Task[None]] = []
            due = time.monotonic()
            while writing:
                tasks.append(asyncio.create_task(one(next(queries))))
                due += 1.0 / args.rate
                await asyncio.sleep(max(0.0, due - time.monotonic()))
            await asyncio.gather(*tasks)

        load_before = os.getloadavg()
        start = time.monotonic()
        await asyncio.gather(writer(), recaller())
    for row in recalls:
        row["t"] -= start
    for w in writes:
        w["start"] -= start
        w["end"] -= start
    return {
        "idle": idle,
        "recalls": recalls,
        "writes": writes,
        "write_seconds": writes[-1]["end"] - writes[0]["start"] if writes else 0.0,
        "loadavg": [load_before, os.getloadavg()],
    }


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    """The figures of one run (pure: unit-tested)."""
    recalls = run["recalls"]
    ok = [r for r in recalls if r["status"] == 200]
    ms = [r["ms"] for r in ok]
    emb = [r["embedding_ms"] for r in ok if r["embedding_ms"] is not None]
    idle = [r["ms"] for r in run["idle"] if r["status"] == 200]
    memories = BATCH * len(run["writes"])
    return {
        "recalls": len(recalls),
        "non_200": len(recalls) - len(ok),
        "p50": pct(ms, 50),
        "p95": pct(ms, 95),
        "p99": pct(ms, 99),
        "max": max(ms, default=float("nan")),
        "degraded": sum(1 for r in ok if r["degraded"]),
        "degraded_by": {
            name: sum(1 for r in ok if name in r["degraded"]) for name in sorted({n for r in ok for n in r["degraded"]})
        },
        "embedding_timeouts": sum(1 for r in ok if "embedding" in r["degraded"]),
        "embedding_p50": pct(emb, 50),
        "embedding_p99": pct(emb, 99),
        "idle_p50": pct(idle, 50),
        "idle_p99": pct(idle, 99),
        "memories": memories,
        "write_seconds": run["write_seconds"],
        "memories_per_s": memories / run["write_seconds"] if run["write_seconds"] else float("nan"),
    }


@contextmanager
def source_tree(rev: str | None) -> Iterator[tuple[Path, str]]:
    """The working tree (``rev`` None) or a detached ``git worktree`` of ``rev``."""
    if rev is None:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
        )
        yield (
            ROOT,
            f"working tree at {head.stdout.strip()}{' (with uncommitted changes)' if dirty.stdout.strip() else ''}",
        )
        return
    path = Path(tempfile.mkdtemp(prefix="braid-tree-")) / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(path), rev], cwd=ROOT, check=True, capture_output=True)
    try:
        short = subprocess.run(
            ["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True, check=True
        )
        yield path, short.stdout.strip()
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, check=False, capture_output=True)
        shutil.rmtree(path.parent, ignore_errors=True)


def run_tree(rev: str | None, label: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    with source_tree(rev) as (root, commit):
        print(f"[{label}] service from {root} ({commit})", file=sys.stderr)
        config_text = None
        if args.threads is not None:
            cfg = yaml.safe_load((root / "config" / "braid.yaml").read_text())
            cfg["embedding"]["threads"] = args.threads
            config_text = yaml.safe_dump(cfg, sort_keys=False)
        svc = Service(root=root, prefix="braid-embed-", config_text=config_text)
        try:
            run = asyncio.run(measure(svc.url, svc.headers, args, seed))
        finally:
            svc.stop()
    run.update(label=label, commit=commit, summary=summarize(run))
    s = run["summary"]
    print(
        f"[{label}] recalls={s['recalls']} p50={s['p50']:.0f} ms p99={s['p99']:.0f} ms "
        f"degraded={s['degraded']} (embedding {s['embedding_timeouts']}) "
        f"writes={s['memories_per_s']:.1f} memories/s; alone p50={s['idle_p50']:.0f} p99={s['idle_p99']:.0f} ms",
        file=sys.stderr,
    )
    return run


def _f(x: float, digits: int = 0) -> str:
    return "n/a" if x != x else f"{x:.{digits}f}"


def report(runs: list[dict[str, Any]], args: argparse.Namespace, command: str, png: str) -> str:
    lines = [
        "# Recall latency during bulk writes (embedding contention)",
        "",
        f"`{command}`",
        "",
        f"Each run: the service from the named commit on a fresh embedded stack, one "
        f"{BATCH}-memory write to recall from, "
        f"embedding.threads {'as shipped' if args.threads is None else args.threads}, {args.idle} recalls alone, then {args.batches} "
        f"writes of {BATCH} memories without client embeddings, back to back, while recalls "
        f"arrive at {args.rate:g}/s (open loop: each sent on time, answered or not), each with "
        "a query text of its own (the query cache never answers). Latency is the client's, "
        "end to end, from the recall's send time; `memories/s` covers the write phase. "
        "`degraded`: recalls whose `degraded` list was not empty, then how often each name "
        "was in it (`embedding`: the query embedding missed `embedding.queryDeadlineMs`; "
        "a source: it timed out, failed, or needed the missing vector).",
        "",
        "| run | commit | recalls | p50 ms | p95 ms | p99 ms | max ms | degraded | named in degraded | "
        "embedding_ms p50 / p99 | alone p50 / p99 ms | memories/s | load avg (1 min) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        s = run["summary"]
        load = " → ".join(f"{la[0]:.1f}" for la in run["loadavg"])
        lines.append(
            f"| {run['label']} | `{run['commit']}` | {s['recalls']} | {_f(s['p50'])} | {_f(s['p95'])} | "
            f"{_f(s['p99'])} | {_f(s['max'])} | {s['degraded']} | "
            f"{', '.join(f'{n} {c}' for n, c in s['degraded_by'].items()) or '-'} | "
            f"{_f(s['embedding_p50'], 1)} / {_f(s['embedding_p99'], 1)} | "
            f"{_f(s['idle_p50'])} / {_f(s['idle_p99'])} | {_f(s['memories_per_s'], 1)} | {load} |"
        )
    lines += [
        "",
        f"![recall latency over the write phase]({png})",
        "",
        "The machine has 2 cores shared with other work (the load average column); "
        "the numbers are measured, never asserted in tests.",
        "",
    ]
    return "\n".join(lines)


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    cols = 2 if len(runs) > 1 and runs[0]["label"].startswith("before") else 1
    rows = -(-len(runs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.6 * rows), sharey=True, squeeze=False)
    for ax, run in zip(axes.flat, runs):
        for i, w in enumerate(run["writes"]):
            ax.axvspan(w["start"], w["end"], color="0.85" if i % 2 else "0.92", lw=0)
        ok = [r for r in run["recalls"] if r["status"] == 200]
        plain = [r for r in ok if not r["degraded"]]
        degraded = [r for r in ok if r["degraded"]]
        ax.scatter([r["t"] for r in plain], [r["ms"] for r in plain], s=6, label="recall")
        ax.scatter([r["t"] for r in degraded], [r["ms"] for r in degraded], s=10, c="red", label="degraded")
        s = run["summary"]
        ax.set_title(f"{run['label']} ({run['commit']}): p50 {_f(s['p50'])} / p99 {_f(s['p99'])} ms", fontsize=9)
        ax.set_xlabel(f"s into the writes (shaded: one {BATCH}-memory write each)")
        ax.set_yscale("log")
    for row in axes:
        row[0].set_ylabel("recall latency, ms")
    axes[0][0].legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="commit to run as 'before' (a git worktree of it)")
    parser.add_argument("--after", help="commit to run as 'after' (default: the working tree)")
    parser.add_argument("--batches", type=int, default=4, help=f"{BATCH}-memory writes during the recalls")
    parser.add_argument("--idle", type=int, default=40, help="recalls measured with no write running")
    parser.add_argument("--rate", type=float, default=4.0, help="recalls a second during the writes")
    parser.add_argument("--rounds", type=int, default=1, help="before/after pairs, alternated")
    parser.add_argument("--threads", type=int, help="embedding.threads for the service (default: as shipped)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=RESULTS / "embed-contention")
    parser.add_argument("--report-only", action="store_true", help="rewrite the .md and .png from the .json")
    args = parser.parse_args(argv)
    if args.report_only:
        saved = json.loads(args.out.with_suffix(".json").read_text())
        for key, kind in (("batches", int), ("idle", int), ("rate", float), ("threads", int)):
            value = saved["args"][key]
            setattr(args, key, None if value == "None" else kind(value))
        _write(saved["runs"], args, saved["command"])
        return
    command = "python -m benchmarks.embed_contention " + shlex.join(argv if argv is not None else sys.argv[1:])

    plan: list[tuple[str | None, str]] = []
    for i in range(args.rounds):
        suffix = f" #{i + 1}" if args.rounds > 1 else ""
        if args.before:
            plan.append((args.before, f"before{suffix}"))
        plan.append((args.after, f"after{suffix}" if args.before else f"run{suffix}"))
    runs = [run_tree(rev, label, args, args.seed) for rev, label in plan]
    data = {"command": command, "args": {k: str(v) for k, v in vars(args).items()}, "runs": runs}
    _write(runs, args, command, data)


def _write(runs: list[dict[str, Any]], args: argparse.Namespace, command: str, data: Any = None) -> None:
    """The .md and .png of ``runs`` and, given ``data``, the .json."""
    for run in runs:
        run["summary"] = summarize(run)
    png = args.out.with_suffix(".png")
    write_results(args.out.stem, report(runs, args, command, png.name), data, results=args.out.parent)
    plot(runs, png)
    for run in runs:
        s = run["summary"]
        print(
            f"embed-contention {run['label']}: p50={_f(s['p50'])} ms p99={_f(s['p99'])} ms "
            f"degraded={s['degraded']}/{s['recalls']} embedding_timeouts={s['embedding_timeouts']} "
            f"writes={_f(s['memories_per_s'], 1)} memories/s"
        )


if __name__ == "__main__":
    main()
