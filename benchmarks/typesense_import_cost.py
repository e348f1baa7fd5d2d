"""What a keyword document costs Typesense to import, as Braid sends it and with the bare ``terms`` it used to send.

``python -m benchmarks.typesense_import_cost [--rounds 3] [--batch 100]``
starts an embedded Typesense, builds the keyword documents of the LoCoMo
turns (``benchmarks/quality/locomo.py``'s mapping: text, speaker, date and
the neighbouring turns as context) with :func:`indexers.typesense.documents.record_document`,
and imports them into a fresh keyword collection (Braid's schema), in
batches, once as they are and once with the ``terms`` field an older
Braid also sent (the same terms without the tenant's key, indexed as a
``string[]``; nothing has filtered on it since filters name the tenant by
its key). The two take turns within each round, in alternating order, so a
drift of the shared machine falls on both. Reports the Typesense process'
CPU per document (median over rounds). Writes
``benchmarks/results/typesense-import-cost.{md,json}`` and prints::

    typesense-import-cost: docs=<n> sent=<ms> with_terms=<ms> ms CPU/doc
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import msgspec
import psutil

from benchmarks.common import LOCOMO_DATA, write_results
from benchmarks.quality.locomo import conversation_memories, load_conversations
from deploy.embedded import EmbeddedTypesense
from indexers.base import MemoryRecord
from indexers.typesense.documents import collection_schema, document_terms, record_document

VARIANTS = ("sent", "with_terms")


def locomo_records() -> list[MemoryRecord]:
    """The LoCoMo turns as the memories the quality benchmark writes, one tenant a conversation."""
    out = []
    for conv in load_conversations(LOCOMO_DATA):
        for m in conversation_memories(conv):
            out.append(
                MemoryRecord(
                    id=m["id"],
                    tenant=f"locomo-{conv.id}",
                    content=m["content"],
                    kind="note",
                    tier="session",
                    created_at=datetime.fromisoformat(m["created_at"].replace("Z", "+00:00")),
                    confidence=1.0,
                    speaker=m.get("speaker"),
                    context=m.get("context"),
                )
            )
    return out


def with_terms(record: MemoryRecord) -> dict[str, Any]:
    """The keyword document plus the bare terms, as an older Braid sent it."""
    doc = record_document(record)
    doc["terms"] = document_terms(record.content, record.context)[0]
    return doc


def server_process(home: Path) -> psutil.Process:
    """The embedded Typesense started under ``home``."""
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or ())
        if "typesense-server" in cmdline and str(home) in cmdline:
            return proc
    raise RuntimeError("the embedded Typesense process was not found")


async def import_batches(client: httpx.AsyncClient, collection: str, docs: list[dict[str, Any]], batch: int) -> None:
    """Upsert ``docs`` into ``collection`` ``batch`` at a time; any document refused is an error."""
    enc = msgspec.json.Encoder()
    for i in range(0, len(docs), batch):
        part = docs[i : i + batch]
        r = await client.post(
            f"/collections/{collection}/documents/import?action=upsert", content=b"\n".join(enc.encode(d) for d in part)
        )
        r.raise_for_status()
        if r.text.count('"success":true') != len(part):
            raise RuntimeError(f"import failed: {r.text[:300]}")


async def run(rounds: int, batch: int) -> dict[str, Any]:
    records = locomo_records()
    docs = {"sent": [record_document(r) for r in records], "with_terms": [with_terms(r) for r in records]}
    home = Path(tempfile.mkdtemp(prefix="braid-import-cost-"))
    ts = EmbeddedTypesense(home / "typesense")
    url = ts.start()
    cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
    try:
        server = server_process(home)
        schema = collection_schema("x")
        # The field an older Braid's schema declared for them.
        schema["fields"].append({"name": "terms", "type": "string[]", "optional": True})
        async with httpx.AsyncClient(base_url=url, headers={"X-TYPESENSE-API-KEY": ts.api_key}, timeout=600) as c:
            for n in range(rounds):
                for variant in VARIANTS if n % 2 == 0 else VARIANTS[::-1]:
                    name = f"import_{n}_{variant}"
                    (await c.post("/collections", json={**schema, "name": name})).raise_for_status()
                    before = sum(server.cpu_times()[:2])
                    part = docs[variant]
                    await import_batches(c, name, part, batch)
                    cpu[variant].append((sum(server.cpu_times()[:2]) - before) / len(part) * 1000)
                    await c.delete(f"/collections/{name}")
                    print(f"round {n + 1}/{rounds}: {variant} {cpu[variant][-1]:.3f} ms/doc", flush=True)
    finally:
        ts.stop()
    return {
        "docs": len(records),
        "rounds": rounds,
        "batch": batch,
        "cpu_ms_per_doc": cpu,
        "median": {v: statistics.median(cpu[v]) for v in VARIANTS},
    }


def markdown(report: dict[str, Any], command: str) -> str:
    med = report["median"]
    rows = [
        f"| {label} | {med[v]:.3f} | {', '.join(f'{x:.3f}' for x in report['cpu_ms_per_doc'][v])} |"
        for v, label in (("sent", "as Braid sends it"), ("with_terms", "with the bare `terms` (before)"))
    ]
    return "\n".join(
        [
            "# Typesense CPU to import a keyword document",
            "",
            f"Command: `{command}`  ",
            f"{report['docs']} LoCoMo turns (text, speaker, date, neighbouring turns as context) as keyword"
            f" documents (`record_document`), imported in batches of {report['batch']} into a fresh collection"
            " with Braid's keyword schema on an embedded Typesense 0.24.1; the two variants take turns in each of"
            f" {report['rounds']} rounds. CPU: the Typesense process' user + system time per document.",
            "",
            "| document | CPU ms a document (median) | each round |",
            "|---|---|---|",
            *rows,
            "",
            f"Saving: {med['with_terms'] - med['sent']:.3f} ms a document"
            f" ({(med['with_terms'] - med['sent']) / med['with_terms']:.0%} of the import).",
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args()
    if args.rounds < 1 or args.batch < 1:
        parser.error("--rounds and --batch: 1 or more")
    command = "python -m benchmarks.typesense_import_cost " + " ".join(sys.argv[1:])
    report = asyncio.run(run(args.rounds, args.batch))
    path = write_results("typesense-import-cost", markdown(report, command.strip()), report)
    print(f"wrote {path}")
    med = report["median"]
    print(
        f"typesense-import-cost: docs={report['docs']} sent={med['sent']:.3f} with_terms={med['with_terms']:.3f} ms CPU/doc"
    )


if __name__ == "__main__":
    main()
