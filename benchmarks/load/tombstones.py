"""What the write requests since Typesense's last memtable flush cost its
searches, on a load run's live stack, its client paused.

    python -m benchmarks.load.tombstones /tmp/braid-load-XXXX [--requests 0,100,200,400] [--snapshot]

Pause the load first (``kill -STOP <its pid>`` once it prints ``load:
hnsw``) and resume it afterwards. Typesense 0.24.1 keeps each write request
in its RocksDB store until it is applied and then deletes it as a key range;
those range tombstones stay in the memtable until it is flushed, and every
document a search returns reads through all of them.

The big tenant's keyword source (Braid's own ``TypesenseSource``, the run's
config) recalls ``--queries`` of the load corpus' query texts once, and its
bm25 candidate searches are kept. Then, for each count N of ``--requests``:
the node compacts its store (``POST /operations/db/compact``, which flushes
the memtable first), N import requests upsert one stored document of the
big tenant unchanged (one document a request, as a single write's), and the
kept candidate searches are sent one at a time, as Braid sends them and
with a page of 10. Per row: Typesense's CPU per search (psutil). With
``--snapshot`` the run then waits for the node's own timed snapshot (a new
directory under its ``state/snapshot``; up to ``SNAPSHOT_WAIT_S``), which
flushes the memtable too, and sends them once more. Writes
``benchmarks/results/tombstones-<name or documents>.{md,json,png}``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import msgspec

from benchmarks.common import RESULTS, pyplot, write_results
from config.loader import parse_config
from indexers.base import Filters, SearchQuery
from indexers.typesense.client import TypesenseClient
from indexers.typesense.source import TypesenseSource

from .corpus import BIG_TENANT, build_corpus
from .keyword_cost import Recorder, role_of, typesense_cpu_ms
from .probe import attach
from .run import KEYWORD_ALIAS, search_aliases

__all__ = ["measure", "markdown"]

#: How long ``--snapshot`` waits for the node's timed snapshot (seconds): the
#: node looks at its timer about once a minute.
SNAPSHOT_WAIT_S = 150.0

#: The page sizes of the rows: Braid's candidate search as sent, and 10.
PAGES = ("as sent", 10)


def _snapshots(home: Path) -> set[str]:
    path = home / "typesense" / "data" / "state" / "snapshot"
    return {p.name for p in path.iterdir()} if path.is_dir() else set()


async def measure(home: Path, requests: Sequence[int], queries: int, snapshot: bool) -> dict[str, Any]:
    svc = attach(home)
    cfg = parse_config((home / "braid.yaml").read_text())
    cpu_ms = typesense_cpu_ms(svc)
    url = f"http://127.0.0.1:{svc.typesense_port()}"
    headers = {"X-TYPESENSE-API-KEY": svc.ts_key}
    texts = [q["text"] for q in build_corpus(3000, seed=7).queries][:queries]
    client = TypesenseClient([url], svc.ts_key, timeout=60.0)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600.0) as ts:
        own, _ = await search_aliases(ts, svc.postgres_dsn(), BIG_TENANT)
        # Writes name the collection, never the alias (see indexers.typesense.index).
        collection = (await ts.get(f"/aliases/{own}")).json().get("collection_name", own)
        info = (await ts.get(f"/collections/{collection}")).json()
        found = await ts.get(
            f"/collections/{collection}/documents/search",
            params={"q": "*", "per_page": 1, "filter_by": f"tenant:=`{BIG_TENANT}`"},
        )
        body = msgspec.json.encode(found.json()["hits"][0]["document"])
        report: dict[str, Any] = {
            "collection": collection,
            "documents": info.get("num_documents"),
            "queries": len(texts),
            "rows": [],
        }
        try:
            source = TypesenseSource(client, KEYWORD_ALIAS, lambda: cfg, route=lambda _: (client, own))
            recorder = Recorder(client)
            for text in texts:
                await source.search(SearchQuery(tenant=BIG_TENANT, text=text, vector=None, limit=10, filters=Filters()))
            candidates = [s for searches, _ in recorder.calls for s in searches if role_of(s) == "candidates"]
            report["searches"] = len(candidates)

            async def searched(label: str, n: int) -> None:
                row: dict[str, Any] = {"state": label, "requests": n}
                for page in PAGES:
                    sent = [s if page == "as sent" else {**s, "per_page": page} for s in candidates]
                    before = cpu_ms()
                    for search in sent:
                        await client.multi_search([search])
                    row[f"cpu_ms_{page}"] = (cpu_ms() - before) / len(sent)
                report["rows"].append(row)
                print(
                    f"tombstones: {label}: {row['cpu_ms_as sent']:.2f} ms of Typesense CPU a candidate search,"
                    f" {row['cpu_ms_10']:.2f} with a page of 10",
                    flush=True,
                )

            for n in requests:
                started = time.perf_counter()
                (await ts.post("/operations/db/compact")).raise_for_status()
                compact_s = time.perf_counter() - started
                for _ in range(n):
                    r = await ts.post(
                        f"/collections/{collection}/documents/import", params={"action": "upsert"}, content=body
                    )
                    r.raise_for_status()
                    if b'"success":true' not in r.content:
                        raise RuntimeError(f"the upsert was refused: {r.text[:300]}")
                await searched(f"{n} import requests after a flush", n)
                report["rows"][-1]["compact_s"] = compact_s
            if snapshot and requests:
                seen, waited = _snapshots(home), time.perf_counter()
                while _snapshots(home) <= seen and time.perf_counter() - waited < SNAPSHOT_WAIT_S:
                    await asyncio.sleep(1.0)
                if _snapshots(home) <= seen:
                    report["snapshot"] = f"no timed snapshot within {SNAPSHOT_WAIT_S:.0f} s"
                else:
                    report["snapshot"] = f"timed snapshot after {time.perf_counter() - waited:.0f} s"
                    await searched("then the node's timed snapshot", requests[-1])
                print(f"tombstones: {report['snapshot']}", flush=True)
        finally:
            await client.aclose()
    return report


def markdown(report: dict[str, Any], command: str, plot: str | None) -> str:
    lines = [
        f"# Typesense's CPU a search against the write requests since its last flush: {report['documents']} documents",
        "",
        f"Command: `{command}` on a load run's live stack, its client paused (`kill -STOP`) once it"
        " printed `load: hnsw`. One search at a time; 2 shared cores.  ",
        f"Collection `{report['collection']}`, {report['documents']} documents; {report['searches']} bm25"
        f" candidate searches from {report['queries']} of the load corpus' query texts (Braid's keyword"
        " source, the run's config). Each row: the node compacts its store (flushing the memtable), then"
        " N import requests upsert one stored document unchanged, then the searches are sent as Braid"
        " sends them and with a page of 10.",
        "",
        "| state | import requests since the flush | Typesense CPU ms a candidate search | with a page of 10 |",
        "|---|---|---|---|",
    ]
    for row in report["rows"]:
        lines.append(f"| {row['state']} | {row['requests']} | {row['cpu_ms_as sent']:.2f} | {row['cpu_ms_10']:.2f} |")
    if "snapshot" in report:
        lines += ["", f"Waiting for the node's own snapshot: {report['snapshot']}."]
    if plot:
        lines += ["", f"![Typesense CPU a search against import requests]({plot})"]
    return "\n".join(lines) + "\n"


def _plot(report: dict[str, Any], path: Path) -> bool:
    plt = pyplot()
    rows = [r for r in report["rows"] if "flush" in r["state"]]
    if plt is None or not rows:
        return False
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for page in PAGES:
        ax.plot([r["requests"] for r in rows], [r[f"cpu_ms_{page}"] for r in rows], marker="o", label=f"page {page}")
    ax.set_xlabel("import requests since the memtable's last flush")
    ax.set_ylabel("Typesense CPU ms a candidate search")
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.load.tombstones", description=__doc__)
    parser.add_argument("home", type=Path, help="the load run's home (/tmp/braid-load-*)")
    parser.add_argument("--requests", default="0,100,200,400", help="comma-separated counts of import requests")
    parser.add_argument("--queries", type=int, default=120)
    parser.add_argument("--snapshot", action="store_true", help="then wait for the node's timed snapshot")
    parser.add_argument("--name", default=None, help="report as tombstones-<name> (default: the documents)")
    args = parser.parse_args()
    requests = [int(n) for n in args.requests.split(",") if n.strip()]
    if any(n < 0 for n in requests):
        parser.error("--requests takes counts of 0 or more")
    report = asyncio.run(measure(args.home, requests, args.queries, args.snapshot))
    command = f"python -m benchmarks.load.tombstones <home> --requests {args.requests}" + (
        " --snapshot" if args.snapshot else ""
    )
    name = f"tombstones-{args.name or report['documents']}"
    png = RESULTS / f"{name}.png"
    plotted = _plot(report, png)
    path = write_results(name, markdown(report, command, png.name if plotted else None), report)
    print(f"tombstones: report at {path}", flush=True)


if __name__ == "__main__":
    main()
