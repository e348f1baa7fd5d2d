"""Where a fused recall's (or a write's) CPU goes in the service: a py-spy profile under load.

``python -m benchmarks.recall_profile [--size N] [--seconds S] [--clients C] [--writes R]
[--sources a,b] [--gil | --perf] [--set dotted.key=value ...]`` loads the load benchmark's synthetic corpus (``benchmarks/load/corpus.py``,
big tenant of ``N`` memories) into the service on the embedded stack, then
drives fused recalls (vectors supplied, as ``make bench-load``'s fused rows;
with ``--sources``, recalls restricted to those sources) from ``C`` clients for ``S`` seconds while ``py-spy record`` samples the
service process (``--idle`` off: only samples where a thread was on the CPU).
It reports CPU per recall by process (the load benchmark's meter) and the
service's profile: self and inclusive share of samples by function, and the
share under each of a few named stages. With ``--writes R`` it drives single
writes instead (the load benchmark's steady writes: one memory of the big
tenant under a new id, its vector supplied) at ``R`` a second, open loop, and
the CPU is per write, outbox drain included. ``--gil`` samples only the
thread holding the GIL. ``--perf`` samples with ``perf record`` instead
(CPU clock): the service's CPU by shared object (kernel, interpreter, each C
extension) and by symbol, where py-spy names only Python frames and counts
a frame that called into C that waits or does I/O as busy. Every report
has the service process' own user and kernel CPU per recall. Report:
``benchmarks/results/recall-profile[-<name>].{md,json}`` plus py-spy's raw
collapsed stacks beside it (``.txt``; none with ``--perf``). Last line:
``recall-profile: size=<n> recalls=<n> service_ms=<x> postgres_ms=<x> typesense_ms=<x> samples=<n>``
(``profiler=perf`` in place of the samples with ``--perf``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import msgspec
import psutil

from benchmarks.common import RESULTS, CpuMeter
from benchmarks.load.client import LeanClient
from benchmarks.load.corpus import BIG_TENANT, build_corpus
from benchmarks.load.run import loaded_service, steady_writes, timed
from benchmarks.quality.tuning import Override, parse_set

#: Stages of a recall, each named by a frame that appears under it (the first match wins).
STAGES = {
    "outbox -> typesense": "indexers/sync.py",
    "extraction (spaCy)": "indexers/spacy_extractor.py",
    "typesense source": "indexers/typesense/",
    "pgvector source": "indexers/pgvector.py",
    "graph source": "indexers/graph.py",
    "postgres store (other reads, writes)": "indexers/postgres/",
    "fusion + formatting": "fusion/",
    "psycopg": "psycopg/",
    "httpx/httpcore": "httpcore/",
    "msgspec/json": "msgspec",
    "litestar": "litestar/",
}


def _frames(stack: str) -> list[str]:
    """py-spy's raw format: ``thread;frame;frame;... count`` with frames ``func (file:line)``."""
    return [f.rsplit(":", 1)[0] if f.endswith(")") else f for f in stack.split(";")[1:]]


def summarise(collapsed: str, top: int = 40) -> dict[str, Any]:
    """Self and inclusive sample counts by function, and by stage, from py-spy's raw output."""
    self_c: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    stage: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        count = int(n)
        frames = _frames(stack)
        total += count
        if frames:
            self_c[frames[-1]] += count
        for f in set(frames):
            incl[f] += count
        joined = ";".join(frames)
        stage[next((name for name, mark in STAGES.items() if mark in joined), "other")] += count
    share = lambda c: {k: round(v / max(total, 1), 4) for k, v in c.most_common(top)}  # noqa: E731
    return {"samples": total, "self": share(self_c), "inclusive": share(incl), "stages": share(stage)}


def py_spy(
    pid: int,
    out: Path,
    *,
    rate: int = 200,
    seconds: int | None = None,
    native: bool = False,
    gil: bool = False,
) -> subprocess.Popen[bytes]:
    """``py-spy record`` of ``pid`` into ``out`` (raw format) at ``rate`` Hz,
    for ``seconds`` or until sent SIGINT; ``native`` adds C frames (else the
    process is sampled without being paused); ``gil``: only the thread
    holding the GIL is sampled, so a thread waiting for it (or in C code
    that let it go) is not counted where it waits."""
    return subprocess.Popen(
        [
            shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy")),
            "record",
            "--pid",
            str(pid),
            "--rate",
            str(rate),
            "--format",
            "raw",
            *(["--duration", str(seconds)] if seconds is not None else []),
            "--output",
            str(out),
            *(["--native"] if native else ["--nonblocking"]),
            *(["--gil"] if gil else []),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def perf_record(pid: int, out: Path, *, rate: int, seconds: int) -> subprocess.Popen[bytes]:
    """``perf record`` (CPU clock, no call graphs) of ``pid`` into ``out`` at
    ``rate`` Hz for ``seconds``: every sample is CPU time, in the kernel,
    the interpreter or any C extension."""
    perf = shutil.which("perf")
    if perf is None:
        raise SystemExit("--perf needs the perf tool (Debian: linux-perf) on PATH")
    return subprocess.Popen(
        [perf, "record", "-F", str(rate), "-p", str(pid), "-o", str(out), "--", "sleep", str(seconds)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


#: The collector's own functions (CPython 3.11): a collection's work, as perf names it.
GC_SYMBOLS = re.compile(
    r"\[\.\] (gc_collect_main|visit_decref|visit_reachable|subtract_refs|update_refs|move_unreachable"
    r"|deduce_unreachable|\w+_traverse)$"
)


def perf_shares(data: Path, key: str, top: int | None = 30) -> dict[str, float]:
    """``perf report --sort <key>`` of ``data``: each shared object (``dso``)
    or symbol (``sym``) and its share of the samples, largest first."""
    text = subprocess.run(
        ["perf", "report", "-i", str(data), "--sort", key, "--stdio", "--no-children", "-g", "none"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    shares: dict[str, float] = {}
    for line in text.splitlines():
        head, _, name = line.strip().partition("%")
        if not name or line.lstrip().startswith("#"):
            continue
        try:
            shares[name.strip()] = round(float(head) / 100.0, 4)
        except ValueError:
            continue
        if top is not None and len(shares) >= top:
            break
    return shares


async def profile(
    size: int,
    seconds: float,
    clients: int,
    rate: int,
    out: Path,
    native: bool = False,
    writes: float = 0.0,
    sources: list[str] | None = None,
    sets: list[Override] | None = None,
    gil: bool = False,
    perf: bool = False,
) -> dict[str, Any]:
    corpus = build_corpus(size)
    report: dict[str, Any] = {
        "size": size,
        "seconds": seconds,
        "clients": clients,
        "rate": rate,
        "writes": writes,
        "sources": sources,
        "sets": [f"{k}={v}" for k, v in sets or ()],
        "gil": gil,
        "perf": perf,
    }
    print("profile: loading", flush=True)
    async with loaded_service(corpus, "braid-profile-", sets=sets or ()) as (svc, headers):
        only = {"sources": sources} if sources else {}
        bodies = [
            msgspec.json.encode({"query": q["text"], "embedding": v.tolist(), **only})
            for q, v in zip(corpus.queries, corpus.query_vectors, strict=True)
        ]
        meter = CpuMeter(svc.processes)
        recall_headers = {**headers[BIG_TENANT], "content-type": "application/json"}
        async with LeanClient(svc.url, max_connections=64) as lean:
            print("profile: warm-up", flush=True)
            await timed(lean, recall_headers, bodies, 4, 0)
            kind = "+".join(sources) if sources else "fused"
            what = f"single writes at {writes:g}/s" if writes else f"{kind} recalls at {clients} clients"
            print(f"profile: {seconds:.0f} s of {what} under {'perf' if perf else 'py-spy'}", flush=True)
            raw = out.with_suffix(".perf.data" if perf else ".txt")
            if perf:
                spy = perf_record(svc.proc.pid, raw, rate=rate, seconds=int(seconds))
            else:
                spy = py_spy(svc.proc.pid, raw, rate=rate, seconds=int(seconds), native=native, gil=gil)
            await asyncio.sleep(1.0)  # the profiler attaches before the measured recalls start
            own = psutil.Process(svc.proc.pid)
            own_before = own.cpu_times()
            if writes:
                async with httpx.AsyncClient(base_url=svc.url, timeout=300) as health:
                    done = await steady_writes(
                        lean, health, recall_headers, corpus, (int(writes),), seconds - 2, meter, svc.postgres_dsn()
                    )
                w = done[str(int(writes))]
                row = {
                    "n": w["writes"],
                    "qps": w["acked_per_s"],
                    "p50": w["ack_ms"]["p50"],
                    "cpu_ms": w["cpu_ms_per_write"],
                    "degraded": w["error_count"],
                }
            else:
                row = await timed(lean, recall_headers, bodies, clients, seconds - 2, meter)
            own_after = own.cpu_times()
            _, err = spy.communicate(timeout=120)
            if spy.returncode != 0:
                raise RuntimeError(f"profiler failed: {err.decode(errors='replace')[-2000:]}")
        n = max(row["n"], 1)
        # The service process alone (not its children): in user space and in the kernel.
        report["service_user_ms"] = (own_after.user - own_before.user) * 1000.0 / n
        report["service_system_ms"] = (own_after.system - own_before.system) * 1000.0 / n
        report["recalls"] = row["n"]
        report["qps"] = row["qps"]
        report["p50_ms"] = row["p50"]
        report["cpu_ms"] = row["cpu_ms"]
        report["degraded"] = row["degraded"]
        if perf:
            symbols = perf_shares(raw, "sym", top=None)
            report["perf"] = {
                "dso": perf_shares(raw, "dso"),
                "symbols": dict(list(symbols.items())[:30]),
                "gc": round(sum(v for k, v in symbols.items() if GC_SYMBOLS.fullmatch(k)), 4),
            }
            raw.unlink()  # large, and the tables hold what it says
        else:
            report["profile"] = summarise(raw.read_text())
    return report


def _sampler(report: dict[str, Any]) -> str:
    """How the service was sampled, as the report says it."""
    if report.get("perf"):
        return (
            f"`perf record` at {report['rate']} Hz on the service process (CPU clock: every sample is CPU "
            "time, in the kernel, the interpreter or a C extension)."
        )
    how = (
        "`--gil`: only the thread holding the GIL is sampled"
        if report.get("gil")
        else "samples only while a thread is on the CPU, GIL or not"
    )
    return (
        f"py-spy at {report['rate']} Hz on the service ({how}). py-spy counts a sample whose innermost "
        "Python frame called into C that waits or does I/O (psycopg's pipeline, a socket write, "
        "granian's send) as active: `--perf` shows how little CPU those calls take."
    )


def markdown(report: dict[str, Any], command: str) -> str:
    cpu = report["cpu_ms"]
    prof = report.get("profile")
    unit = "write" if report.get("writes") else "recall"
    kind = "+".join(report["sources"]) if report.get("sources") else "fused"
    driven = (
        f"single writes at {report['writes']:g}/s (vectors supplied), outbox drained"
        if report.get("writes")
        else f"{kind} recalls with vectors supplied, {report['clients']} clients"
    )
    if report.get("sets"):
        driven += "; config: shipped with " + ", ".join(f"`{s}`" for s in report["sets"])
    lines = [
        f"# Where a {'fused' if unit == 'write' else kind} {unit}'s CPU goes (service profile under load)",
        "",
        f"Command: `{command}`  ",
        f"Corpus: the load benchmark's, big tenant of {report['size']} memories; {driven} for "
        f"{report['seconds']:.0f} s; " + _sampler(report),
        "",
        f"{unit.title()}s: {report['recalls']} ({report['qps']:.1f}/s, p50 {report['p50_ms']:.1f} ms, "
        f"{report['degraded']} {'errors' if report.get('writes') else 'degraded'}).",
        "",
        f"| CPU ms per {unit} | service | postgres | typesense | client |",
        "|---|---|---|---|---|",
        f"| | {cpu.get('service', 0):.2f} | {cpu.get('postgres', 0):.2f} | {cpu.get('typesense', 0):.2f} "
        f"| {cpu.get('client', 0):.2f} |",
        "",
    ]
    if "service_user_ms" in report:
        lines += [
            f"The service process alone (its children not counted): {report['service_user_ms']:.2f} ms in user "
            f"space and {report['service_system_ms']:.2f} ms in the kernel per {unit}.",
            "",
        ]
    if report.get("perf"):
        lines += [
            f"Garbage collection (the collector's functions, `{GC_SYMBOLS.pattern}`): "
            f"{report['perf'].get('gc', 0.0):.1%} of the service's samples.",
            "",
        ]
        for title, key in (("shared object", "dso"), ("symbol", "symbols")):
            lines += [f"## Service CPU samples by {title}", "", f"| {title} | share |", "|---|---|"]
            lines += [f"| `{k}` | {v:.1%} |" for k, v in report["perf"][key].items()]
            lines.append("")
        return "\n".join(lines)
    assert prof is not None
    service_ms = cpu.get("service", 0.0)
    lines += [
        f"## Service samples by stage ({prof['samples']} samples; first matching stage of each stack)",
        "",
        f"| stage | share | ≈ ms per {unit} |",
        "|---|---|---|",
    ]
    lines += [f"| {k} | {v:.1%} | {v * service_ms:.2f} |" for k, v in prof["stages"].items()]
    for title, key in (("self", "self"), ("inclusive", "inclusive")):
        lines += ["", f"## Top functions, {title}", "", "| function | share |", "|---|---|"]
        lines += [f"| `{k}` | {v:.1%} |" for k, v in prof[key].items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--name", default="", help="report name suffix")
    parser.add_argument("--writes", type=float, default=0.0, help="profile single writes at this rate a second instead")
    parser.add_argument(
        "--native", action="store_true", help="py-spy --native: C extension frames too (pauses the service to sample)"
    )
    parser.add_argument(
        "--perf",
        action="store_true",
        help="profile with perf instead of py-spy: CPU by shared object and symbol (kernel, interpreter, C)",
    )
    parser.add_argument(
        "--gil",
        action="store_true",
        help="py-spy --gil: only samples holding the GIL (the service's Python at work, not waiting for it)",
    )
    parser.add_argument(
        "--sources", default="", help="comma list: recalls restricted to these sources (default: fused)"
    )
    parser.add_argument(
        "--set", action="append", default=[], type=parse_set, help="dotted.key=value over the shipped config"
    )
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = "write-cpu-profile" if args.writes else "recall-profile"
    out = RESULTS / (stem + (f"-{args.name}" if args.name else "") + ".md")
    sources = [s for s in args.sources.split(",") if s] or None
    report = asyncio.run(
        profile(
            args.size,
            args.seconds,
            args.clients,
            args.rate,
            out,
            args.native,
            args.writes,
            sources,
            args.set,
            args.gil,
            args.perf,
        )
    )
    command = "python -m benchmarks.recall_profile " + " ".join(sys.argv[1:])
    out.write_text(markdown(report, command))
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    cpu = report["cpu_ms"]
    print(f"wrote {out}")
    print(
        f"recall-profile: size={report['size']} recalls={report['recalls']} service_ms={cpu.get('service', 0):.2f} "
        f"postgres_ms={cpu.get('postgres', 0):.2f} typesense_ms={cpu.get('typesense', 0):.2f} "
        + (f"samples={report['profile']['samples']}" if "profile" in report else "profiler=perf")
    )


if __name__ == "__main__":
    main()
