"""The entity tier's HNSW at size: recall@10 and insert cost against its m / efConstruction.

``python -m benchmarks.entity_hnsw [--names N] [--settings 24/128,16/64] [--queries Q]``
embeds ``N`` distinct entity-like names (the 1-3-word phrases of LongMemEval's
turns, most frequent first; the model the service runs, onnxruntime) into a
table shaped like ``entities`` on an embedded Postgres, builds the tier's
HNSW index with each setting, and asks it ``Q`` real questions (LoCoMo's and
LongMemEval's, embedded the same way) at several ``ef_search``: recall@10
against an exact scan of every row, as the graph's vector seeds ask it.
Then it inserts 1,000 more names one row at a time into the built index
(what a write that makes new entities pays) and reports the time per row.

Report: ``benchmarks/results/entity-hnsw.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg import register_vector

from benchmarks.common import ROOT, write_results
from benchmarks.load.hnsw import exact_top_k, recall_at_k
from deploy.embedded import EmbeddedPostgres
from indexers.onnx_minilm import OnnxMiniLM, default_path

DATA = ROOT.parent / "shared" / "data"
EF_GRID = (32, 64, 128, 256)
_WORD = re.compile(r"[a-z][a-z'-]{2,}")
_STOP = frozenset(
    "the and for you that with this are was have your can but not what about they from just would like "
    "there their been some also more will when which one our out how get has had his her its all any".split()
)


def _names(n: int) -> list[str]:
    counts: Counter[str] = Counter()
    for q in json.loads((DATA / "longmemeval" / "longmemeval_s_dev.json").read_text()):
        for session in q["haystack_sessions"]:
            for turn in session:
                words = [w for w in _WORD.findall(turn["content"].lower()) if w not in _STOP]
                for size in (1, 2, 3):
                    counts.update(" ".join(words[i : i + size]) for i in range(len(words) - size + 1))
        if len(counts) > 40 * n:
            break
    return [name for name, _ in counts.most_common(n)]


def _questions(limit: int) -> list[str]:
    out = [q["question"] for q in json.loads((DATA / "longmemeval" / "longmemeval_s_dev.json").read_text())]
    for path in sorted((DATA / "locomo").glob("*.json")):
        out += [q["question"] for q in json.loads(path.read_text()).get("qa", []) if q.get("question")]
    return out[:limit]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--names", type=int, default=100_000)
    parser.add_argument("--settings", default="24/128,16/64")
    parser.add_argument("--queries", type=int, default=300)
    args = parser.parse_args()
    settings = [tuple(int(x) for x in s.split("/")) for s in args.settings.split(",")]
    model = OnnxMiniLM(default_path())
    t0 = time.perf_counter()
    names = _names(args.names + 1000)
    base, extra = names[: args.names], names[args.names :]
    vectors = model.encode(base, batch_size=256)
    extra_vectors = model.encode(extra, batch_size=256)
    questions = _questions(args.queries)
    queries = model.encode(questions)
    print(f"entity-hnsw: {len(base)} names embedded in {time.perf_counter() - t0:.0f} s", flush=True)
    truth = exact_top_k(vectors, queries, 10)
    report: dict[str, Any] = {"names": len(base), "queries": len(questions), "rows": []}
    pg = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="braid-entity-hnsw-")) / "pg")
    dsn = pg.start()
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            register_vector(conn)
            for m, efc in settings:
                conn.execute("DROP TABLE IF EXISTS ents")
                conn.execute("CREATE TABLE ents (id bigint PRIMARY KEY, embedding vector(384) NOT NULL)")
                with conn.cursor().copy("COPY ents (id, embedding) FROM STDIN WITH (FORMAT BINARY)") as copy:
                    copy.set_types(["int8", "vector"])
                    for i, v in enumerate(vectors):
                        copy.write_row((i, v))
                start = time.perf_counter()
                conn.execute(
                    f"CREATE INDEX ents_hnsw ON ents USING hnsw (embedding vector_cosine_ops)"
                    f" WITH (m = {m}, ef_construction = {efc})"
                )
                build_s = time.perf_counter() - start
                row: dict[str, Any] = {"m": m, "ef_construction": efc, "build_s": build_s, "recall": {}}
                for ef in EF_GRID:
                    hits = []
                    with conn.transaction():
                        conn.execute(f"SET LOCAL hnsw.ef_search = {ef}")
                        for q in queries:
                            cur = conn.execute("SELECT id FROM ents ORDER BY embedding <=> %s LIMIT 10", (q,))
                            hits.append([r[0] for r in cur.fetchall()])
                    row["recall"][ef] = float(
                        np.mean([recall_at_k(h, list(t), 10) for h, t in zip(hits, truth, strict=True)])
                    )
                start = time.perf_counter()
                for i, v in enumerate(extra_vectors, len(base)):
                    conn.execute("INSERT INTO ents (id, embedding) VALUES (%s, %s)", (i, v))
                row["insert_ms"] = (time.perf_counter() - start) / max(len(extra_vectors), 1) * 1000
                report["rows"].append(row)
                print(f"entity-hnsw: {m}/{efc}: {row}", flush=True)
    finally:
        pg.stop()
    lines = [
        "# The entity tier's HNSW at size",
        "",
        f"Command: `python -m benchmarks.entity_hnsw --names {args.names} --settings {args.settings}"
        f" --queries {args.queries}`  ",
        f"{len(base)} entity-like names (LongMemEval's most frequent 1-3-word phrases), embedded with the"
        f" service's model; {len(questions)} real questions (LongMemEval, then LoCoMo) as queries, as the"
        " graph's vector seeds ask; recall@10 against an exact scan; insert = 1,000 more names, one row a"
        " statement, into the built index (wall ms a row, one connection).",
        "",
        "| m / efConstruction | build s | "
        + " | ".join(f"recall@10 ef {ef}" for ef in EF_GRID)
        + " | insert ms a row |",
        "|---|---|" + "---|" * len(EF_GRID) + "---|",
        *(
            f"| {r['m']} / {r['ef_construction']} | {r['build_s']:.0f} | "
            + " | ".join(f"{r['recall'][ef]:.3f}" for ef in EF_GRID)
            + f" | {r['insert_ms']:.2f} |"
            for r in report["rows"]
        ),
        "",
        "The service's entity tier searches at `efSearch` 128.",
    ]
    path = write_results("entity-hnsw", "\n".join(lines) + "\n", report)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
