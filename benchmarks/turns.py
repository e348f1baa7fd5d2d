"""What an agent's turn costs: a write, then a recall about it.

``python -m benchmarks.turns [--size N] [--ops 400] [--clients 4] [--rounds 2] [--profile] [--name X]``
loads the load benchmark's corpus (``benchmarks/load/corpus.py``, big tenant
of ``N`` memories, then the ``placement`` job) into the service on the
embedded stack and runs three phases of ``--ops`` operations each on the big
tenant, closed loop from ``--clients`` clients, ``--rounds`` times in turn:

* ``recalls``: a fused recall whose query is one of the tenant's memories
  (its text and vector), as an agent recalls with the turn it just saw;
* ``writes``: a single write (one of the tenant's memories under a new id:
  its fields, entities and vector; Braid's own extraction as shipped);
* ``turns``: that write, then the recall of the same memory's text and
  vector: the recall runs right after a write that changed the tenant's graph.

CPU per operation by process (the load benchmark's meter), read from before
the first operation until the outbox has applied the writes. The cost of a
recall right after a write is ``turns - writes``, against ``recalls``. With
``--profile``, py-spy samples the service through each phase of the last
round (as ``benchmarks.recall_profile`` does), and the report adds the
service's CPU an operation by stage (its share of samples times its CPU).
Report: ``benchmarks/results/turns[-<name>].{md,json}``. Last line:
``turns: size=<n> recall_ms=<service CPU> recall_after_write_ms=<service CPU> write_ms=<service CPU>``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import signal
import statistics
import sys
from typing import Any

import httpx
import msgspec

from benchmarks.common import RESULTS, CpuMeter, cpu_per_call, write_results
from benchmarks.load.client import LeanClient
from benchmarks.load.corpus import BIG_TENANT, build_corpus, describe
from benchmarks.load.run import loaded_service, wait_drained
from benchmarks.recall_profile import py_spy, summarise

_encode = msgspec.json.Encoder().encode
PHASES = ("recalls", "writes", "turns")


async def _phase(
    phase: str,
    client: LeanClient,
    health: httpx.AsyncClient,
    headers: dict[str, str],
    corpus: Any,
    ops: int,
    clients: int,
    counter: Any,
    meter: CpuMeter,
) -> dict[str, Any]:
    big = corpus.tenants[0]
    errors: list[str] = []
    queue = iter(range(ops))

    async def one() -> None:
        for _ in queue:
            i = next(counter)
            j = i % len(big.memories)
            memory = big.memories[j]
            vector = big.vectors[j].tolist()
            if phase != "recalls":
                body = {"memories": [{**memory, "id": f"turn-{i:07d}", "embedding": vector}]}
                code, raw = await client.post("/v1/memories", _encode(body), headers)
                if code != 201:
                    errors.append(f"write {code} {raw[:120]!r}")
            if phase != "writes":
                code, raw = await client.post(
                    "/v1/recall", _encode({"query": memory["content"], "embedding": vector}), headers
                )
                if code != 200:
                    errors.append(f"recall {code} {raw[:120]!r}")

    before = meter()
    await asyncio.gather(*(one() for _ in range(clients)))
    await wait_drained(health)
    return {"cpu_ms": cpu_per_call(before, meter(), ops), "errors": errors[:5], "error_count": len(errors)}


async def measure(size: int, ops: int, clients: int, rounds: int, profile: str = "") -> dict[str, Any]:
    corpus = build_corpus(size)
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in PHASES}
    stages: dict[str, dict[str, float]] = {}
    async with loaded_service(corpus, "braid-turns-") as (svc, headers):
        meter = CpuMeter(svc.processes)
        auth = {**headers[BIG_TENANT], "content-type": "application/json"}
        counter = itertools.count()
        async with (
            LeanClient(svc.url, max_connections=64) as client,
            httpx.AsyncClient(base_url=svc.url, timeout=300) as health,
        ):
            for r in range(rounds):
                for phase in PHASES:
                    spy = None
                    if profile and r == rounds - 1:
                        raw = RESULTS / f"turns-{profile}-{phase}.txt"
                        spy = py_spy(svc.proc.pid, raw)
                        await asyncio.sleep(1.0)  # attached before the phase starts
                    run = await _phase(phase, client, health, auth, corpus, ops, clients, counter, meter)
                    runs[phase].append(run)
                    if spy is not None:
                        spy.send_signal(signal.SIGINT)
                        _, err = spy.communicate(timeout=120)
                        if not raw.exists():
                            raise RuntimeError(f"py-spy failed: {err.decode(errors='replace')[-2000:]}")
                        shares = summarise(raw.read_text())["stages"]
                        stages[phase] = {k: v * run["cpu_ms"].get("service", 0.0) for k, v in shares.items()}
                    print(f"turns: round {r + 1} {phase}: {run['cpu_ms']}", flush=True)
    kinds = sorted({k for rs in runs.values() for run in rs for k in run["cpu_ms"]})
    mean = {p: {k: statistics.fmean(run["cpu_ms"].get(k, 0.0) for run in rs) for k in kinds} for p, rs in runs.items()}
    after = {k: mean["turns"][k] - mean["writes"][k] for k in kinds}
    return {
        "size": size,
        "ops": ops,
        "clients": clients,
        "rounds": rounds,
        "corpus": describe(corpus),
        "runs": runs,
        "mean_cpu_ms": mean,
        "recall_after_write_cpu_ms": after,
        "errors": sum(run["error_count"] for rs in runs.values() for run in rs),
        "service_stage_ms": stages,
    }


def markdown(report: dict[str, Any], command: str) -> str:
    kinds = list(report["recall_after_write_cpu_ms"])
    head = " | ".join(kinds)
    lines = [
        "# An agent's turn: a write, then a recall about it",
        "",
        f"Command: `{command}`  ",
        f"Corpus: {report['corpus']}. After the placement job, on the big tenant, {report['ops']} operations a "
        f"phase from {report['clients']} clients (closed loop), the phases in turn, {report['rounds']} rounds: "
        "`recalls` (fused, a query made of one of the tenant's memories: its text and vector), `writes` (single "
        "writes of its memories under new ids, extraction as shipped), `turns` (that write, then the recall of "
        "the same memory). CPU ms an operation by process, until the outbox has applied the writes; "
        "mean over the rounds.",
        "",
        f"| phase | {head} |",
        "|---|" + "---|" * len(kinds),
    ]
    for phase, row in report["mean_cpu_ms"].items():
        lines.append(f"| {phase} | " + " | ".join(f"{row[k]:.2f}" for k in kinds) + " |")
    after = report["recall_after_write_cpu_ms"]
    lines.append("| recall after a write (turns - writes) | " + " | ".join(f"{after[k]:.2f}" for k in kinds) + " |")
    stages = report.get("service_stage_ms") or {}
    if stages:
        names = sorted({k for row in stages.values() for k in row}, key=lambda k: -stages["turns"].get(k, 0.0))
        lines += [
            "",
            "The service's CPU ms an operation by stage, last round, py-spy at 200 Hz (share of samples x the "
            "phase's service CPU; a stack counts under the first stage it matches, as in `benchmarks.recall_profile`):",
            "",
            "| stage | recalls | writes | turns | turns - writes - recalls |",
            "|---|---|---|---|---|",
        ]
        for k in names:
            a, w, t = (stages.get(p, {}).get(k, 0.0) for p in PHASES)
            lines.append(f"| {k} | {a:.2f} | {w:.2f} | {t:.2f} | {t - w - a:+.2f} |")
    lines += ["", f"Errors: {report['errors']}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--ops", type=int, default=400)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="py-spy the service through the last round")
    parser.add_argument("--name", default="")
    args = parser.parse_args()
    report = asyncio.run(
        measure(args.size, args.ops, args.clients, args.rounds, args.name or "run" if args.profile else "")
    )
    command = "python -m benchmarks.turns " + " ".join(sys.argv[1:])
    write_results("turns" + (f"-{args.name}" if args.name else ""), markdown(report, command), report)
    service = {p: row.get("service", 0.0) for p, row in report["mean_cpu_ms"].items()}
    print(
        f"turns: size={args.size} recall_ms={service['recalls']:.2f}"
        f" recall_after_write_ms={report['recall_after_write_cpu_ms'].get('service', 0.0):.2f}"
        f" write_ms={service['writes']:.2f}"
    )


if __name__ == "__main__":
    main()
