"""Recall latency, write throughput and Typesense freshness, measured over HTTP.

Starts ``python -m service`` on the embedded stack in a fresh data directory,
loads the LoCoMo turns from ``../shared/data/locomo`` as memories, then
measures:

* write throughput (memories/s, embeddings computed by the service);
* write-to-searchable freshness in Typesense (single writes, polled);
* recall latency p50/p95/p99 per source alone and fused, with the query
  embedding supplied and computed by the service, at 1 and 8 clients.

Writes ``benchmarks/results/recall_latency.md`` and ``.png`` and prints one
summary line. Usage: ``make bench`` or ``python -m benchmarks.recall_latency``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from deploy.embedded import free_port

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "locomo"


def load_turns(data: Path) -> tuple[list[str], list[str]]:
    turns, questions = [], []
    for file in sorted(data.glob("*.json")):
        conv = json.loads(file.read_text())
        body = conv.get("conversation", conv)
        for key, value in body.items():
            if key.startswith("session_") and isinstance(value, list):
                turns += [f"{t['speaker']}: {t['text']}" for t in value]
        questions += [q["question"] for q in conv.get("qa", []) if q.get("category") in (1, 2, 3, 4)]
    return turns, questions


def pct(values: list[float], p: float) -> float:
    return float(np.percentile(np.asarray(values), p)) if values else float("nan")


class Service:
    """``python -m service`` on the embedded stack, in a fresh ``BRAID_HOME`` on a free port.

    ``config_text`` (YAML) becomes the service's ``BRAID_CONFIG``; without it
    the shipped config and the generated default keys are used. ``root`` is the
    source tree the service runs from (another checkout, e.g. a ``git worktree``
    of an older commit, to compare against).
    """

    def __init__(
        self, *, config_text: str | None = None, prefix: str = "braid-bench-", root: Path = ROOT
    ) -> None:
        self.home = Path(tempfile.mkdtemp(prefix=prefix))
        self.home.chmod(0o755)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("BRAID_")}
        env.update(BRAID_HOME=str(self.home), BRAID_PORT=str(self.port), BRAID_LOG_LEVEL="WARNING")
        # Generated keys are shown once and stored as digests: choose the agent key here.
        self.agent_key = f"braid_bench_{secrets.token_urlsafe(24)}"
        env["BRAID_API_KEY"] = self.agent_key
        if config_text is not None:
            config = self.home / "braid.yaml"
            config.write_text(config_text)
            env["BRAID_CONFIG"] = str(config)
        self.log = open(self.home / "service.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service"], cwd=root, env=env, stdout=self.log, stderr=subprocess.STDOUT
        )
        try:
            self._wait_healthy(180)
        except BaseException:
            self.stop()
            raise
        self.headers = {"Authorization": f"Bearer {self.agent_key}"}
        self.ts_key = (self.home / "typesense" / "api-key").read_text().strip()

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"service exited:\n{self._log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"service not healthy after {timeout:.0f} s:\n{self._log_tail()}")

    def _log_tail(self) -> str:
        self.log.flush()
        return (self.home / "service.log").read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(60)
        self.log.close()
        shutil.rmtree(self.home, ignore_errors=True)


async def timed_recalls(
    client: httpx.AsyncClient, headers: dict[str, str], bodies: list[dict[str, Any]], clients: int
) -> tuple[list[float], float, dict[str, list[float]]]:
    latencies: list[float] = []
    per_source: dict[str, list[float]] = {}
    queue = list(bodies)

    async def worker() -> None:
        while queue:
            body = queue.pop()
            start = time.perf_counter()
            r = await client.post("/v1/recall", json=body, headers=headers)
            latencies.append((time.perf_counter() - start) * 1000)
            r.raise_for_status()
            for name, src in r.json()["sources"].items():
                if src["status"] == "ok":
                    per_source.setdefault(name, []).append(src["ms"])

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    elapsed = time.perf_counter() - start
    return latencies, len(bodies) / elapsed, per_source


async def run(args: argparse.Namespace) -> dict[str, Any]:
    turns, questions = load_turns(args.data)
    turns = turns[: args.limit] if args.limit else turns
    questions = questions[: args.queries]
    svc = Service()
    report: dict[str, Any] = {"memories": len(turns), "queries": len(questions)}
    try:
        async with httpx.AsyncClient(base_url=svc.url, timeout=60) as client:
            start = time.perf_counter()
            for i in range(0, len(turns), 128):
                batch = [{"content": t} for t in turns[i : i + 128]]
                r = await client.post("/v1/memories", json={"memories": batch}, headers=svc.headers)
                r.raise_for_status()
            report["write_per_s"] = len(turns) / (time.perf_counter() - start)

            # Freshness: acknowledged write -> document readable in Typesense.
            fresh = []
            ts = httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{_typesense_port(svc)}",
                headers={"X-TYPESENSE-API-KEY": svc.ts_key},
            )
            for i in range(args.fresh):
                r = await client.post(
                    "/v1/memories",
                    json={"memories": [{"content": f"freshness probe {i}", "embedding": _unit(i)}]},
                    headers=svc.headers,
                )
                acked = time.perf_counter()
                mid = r.json()["ids"][0]
                while (await ts.get(f"/collections/braid_memories/documents/default:{mid}")).status_code != 200:
                    await asyncio.sleep(0.0005)
                fresh.append((time.perf_counter() - acked) * 1000)
            await ts.aclose()
            report["fresh_p50"], report["fresh_p99"] = pct(fresh, 50), pct(fresh, 99)

            # Query vectors computed once by the service's model (cached path measured separately).
            warm = [{"query": q} for q in questions]
            await timed_recalls(client, svc.headers, warm, 4)
            rows = []
            for label, sources in (
                ("typesense", ["typesense"]),
                ("pgvector", ["pgvector"]),
                ("graph", ["graph"]),
                ("fused", None),
            ):
                for clients in (1, 8):
                    bodies = [
                        {"query": q, **({"sources": sources} if sources else {})} for q in questions
                    ]
                    lat, qps, per_source = await timed_recalls(client, svc.headers, bodies, clients)
                    rows.append(
                        {
                            "config": label,
                            "clients": clients,
                            "p50": pct(lat, 50),
                            "p95": pct(lat, 95),
                            "p99": pct(lat, 99),
                            "qps": qps,
                            "sources": {k: pct(v, 50) for k, v in per_source.items()},
                            "latencies": lat,
                        }
                    )
            # Query embedding computed by the service, never seen before (cold cache).
            cold = [{"query": f"{q} (variant {i})"} for i, q in enumerate(questions)]
            lat, qps, _ = await timed_recalls(client, svc.headers, cold, 1)
            rows.append({"config": "fused, cold embedding", "clients": 1, "p50": pct(lat, 50),
                         "p95": pct(lat, 95), "p99": pct(lat, 99), "qps": qps, "sources": {}, "latencies": lat})
            report["rows"] = rows
    finally:
        svc.stop()
    return report


def _typesense_port(svc: Service) -> int:
    pid = int((svc.home / "typesense" / "typesense.pid").read_text())
    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return int(next(a.split("=", 1)[1] for a in cmd if a.startswith("--api-port=")))


def _unit(seed: int) -> list[float]:
    v = np.random.default_rng(seed).standard_normal(384)
    return (v / np.linalg.norm(v)).tolist()


def write_report(report: dict[str, Any], command: str) -> str:
    RESULTS.mkdir(parents=True, exist_ok=True)
    lines = [
        "# Recall latency (embedded stack, one machine)",
        "",
        f"Command: `{command}`  ",
        f"Corpus: {report['memories']} LoCoMo turns as memories; {report['queries']} LoCoMo questions as queries.  ",
        f"Write throughput (server-side embeddings, batches of 128): **{report['write_per_s']:.0f} memories/s**  ",
        f"Freshness, acknowledged write -> readable in Typesense: p50 **{report['fresh_p50']:.1f} ms**, p99 **{report['fresh_p99']:.1f} ms**",
        "",
        "| config | clients | p50 ms | p95 ms | p99 ms | recalls/s | per-source p50 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        src = ", ".join(f"{k} {v:.1f}" for k, v in r["sources"].items())
        lines.append(
            f"| {r['config']} | {r['clients']} | {r['p50']:.1f} | {r['p95']:.1f} | {r['p99']:.1f} | {r['qps']:.0f} | {src} |"
        )
    (RESULTS / "recall_latency.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 4.5))
        for r in report["rows"]:
            data = np.sort(np.asarray(r["latencies"]))
            ax.plot(data, np.linspace(0, 1, len(data)), label=f"{r['config']} ({r['clients']} clients)")
        ax.set_xscale("log")
        ax.set_xlabel("recall latency, ms (log)")
        ax.set_ylabel("fraction of recalls")
        ax.set_title("Braid recall latency CDF")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(RESULTS / "recall_latency.png", dpi=120)
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
    fused8 = next(r for r in report["rows"] if r["config"] == "fused" and r["clients"] == 8)
    return (
        f"bench: memories={report['memories']} fused_p50_ms={fused8['p50']:.1f} "
        f"fused_p99_ms={fused8['p99']:.1f} qps={fused8['qps']:.0f} "
        f"fresh_p99_ms={report['fresh_p99']:.1f} write_per_s={report['write_per_s']:.0f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--limit", type=int, default=0, help="use only the first N turns")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--fresh", type=int, default=100, help="single writes timed for freshness")
    args = parser.parse_args()
    report = asyncio.run(run(args))
    print(write_report(report, "python -m benchmarks.recall_latency " + " ".join(sys.argv[1:])))


if __name__ == "__main__":
    main()
