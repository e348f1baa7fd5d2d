"""``halfvec`` against ``vector`` for a memory tier's HNSW index: size, build time, recall@10, latency.

``python -m benchmarks.halfvec [--rows N] [--settings 16/64,24/128] [--queries Q]``
puts ``N`` vectors made as the load benchmark makes the big tenant's (384-d
unit vectors around 200 Gaussian centres, noise norm ~1.0) in one table of
an embedded Postgres, and for each ``m / efConstruction`` builds two cosine
HNSW indexes on it: one on the ``vector(384)`` column (what Braid builds
today) and one on the expression ``embedding::halfvec(384)`` (2 bytes a
dimension instead of 4). ``Q`` queries (rows perturbed by noise norm ~0.3,
as the load benchmark's) are asked of each at several ``ef_search``, one
connection, one after another; recall@10 counts ids against an exact float64
scan in numpy. Then 500 more rows are inserted one statement each into the
built index (wall ms a row, one connection: what a write pays). The exact search's own loss is reported too: the top 10 by
``embedding::halfvec(384) <=> q`` over every row, which is what a tenant
below ``exactBelow`` would get from a halfvec column.

Report: ``benchmarks/results/halfvec[-NAME].{md,json}``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg import register_vector

from benchmarks.common import write_results
from benchmarks.load.hnsw import ef_needed, exact_top_k, recall_at_k
from deploy.embedded import EmbeddedPostgres

DIM = 384
EF_GRID = (16, 32, 48, 64, 96, 128, 200)
#: Rows inserted one statement each into a built index (what a write pays).
INSERTS = 500
KINDS = {
    # kind: (index expression and opclass, the ORDER BY of a query)
    "vector": ("embedding vector_cosine_ops", "embedding <=> %s"),
    "halfvec": (f"(embedding::halfvec({DIM})) halfvec_cosine_ops", f"embedding::halfvec({DIM}) <=> %s::halfvec({DIM})"),
}


def _unit(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def corpus(rows: int, queries: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows, queries, and :data:`INSERTS` more rows, as
    :func:`benchmarks.load.corpus.build_corpus` draws them."""
    rng = np.random.default_rng(seed)
    centres = _unit(rng.standard_normal((200, DIM)))
    n = rows + INSERTS
    vectors = _unit(centres[rng.integers(0, 200, size=n)] + rng.standard_normal((n, DIM)) / np.sqrt(DIM))
    targets = rng.integers(0, rows, size=queries)
    q = _unit(vectors[targets] + rng.standard_normal((queries, DIM)) * 0.3 / np.sqrt(DIM))
    return vectors[:rows].astype(np.float32), q.astype(np.float32), vectors[rows:].astype(np.float32)


def fill_table(conn: psycopg.Connection, vectors: np.ndarray) -> None:
    """Table ``vecs`` (``id``, ``embedding vector(384)``) holding ``vectors``
    (ids 0..n-1), copied in binary and analyzed."""
    conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    register_vector(conn)
    conn.execute(f"CREATE TABLE vecs (id bigint PRIMARY KEY, embedding vector({DIM}) NOT NULL)")
    with conn.cursor().copy("COPY vecs (id, embedding) FROM STDIN WITH (FORMAT BINARY)") as copy:
        copy.set_types(["int8", "vector"])
        for i, v in enumerate(vectors):
            copy.write_row((i, v))
    conn.execute("VACUUM ANALYZE vecs")


def _ask(conn: psycopg.Connection, order_by: str, queries: np.ndarray, ef: int) -> tuple[list[list[int]], float]:
    """Each query's 10 ids at ``ef``, and the p50 ms a query."""
    hits, ms = [], []
    with conn.transaction():
        conn.execute(f"SET LOCAL hnsw.ef_search = {int(ef)}")
        conn.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
        for q in queries:
            start = time.perf_counter()
            cur = conn.execute(f"SELECT id FROM vecs ORDER BY {order_by} LIMIT 10", (q,))
            hits.append([r[0] for r in cur.fetchall()])
            ms.append((time.perf_counter() - start) * 1000)
    return hits, statistics.median(ms)


def _uses_index(conn: psycopg.Connection, order_by: str, q: np.ndarray, name: str) -> bool:
    cur = conn.execute(f"EXPLAIN SELECT id FROM vecs ORDER BY {order_by} LIMIT 10", (q,))
    return any(name in r[0] for r in cur.fetchall())


def run(rows: int, settings: list[tuple[int, int]], n_queries: int, seed: int) -> dict[str, Any]:
    vectors, queries, extra = corpus(rows, n_queries, seed)
    truth = [list(t) for t in exact_top_k(vectors, queries, 10)]

    def recall(hits: list[list[int]]) -> float:
        return float(np.mean([recall_at_k(h, t, 10) for h, t in zip(hits, truth, strict=True)]))

    report: dict[str, Any] = {"rows": rows, "queries": n_queries, "seed": seed, "indexes": []}
    pg = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="braid-halfvec-")) / "pg")
    dsn = pg.start()
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            fill_table(conn, vectors)
            cur = conn.execute("SELECT pg_table_size('vecs')")
            report["table_bytes"] = int(cur.fetchone()[0])  # type: ignore[index]
            # The exact answer with halfvec's precision (no index: a sequential scan).
            conn.execute("SET enable_indexscan = off")
            exact_half, _ = _ask(conn, KINDS["halfvec"][1], queries, 40)
            conn.execute("RESET enable_indexscan")
            report["exact_halfvec_recall"] = recall(exact_half)
            print(f"halfvec: {rows} rows; exact halfvec recall@10 {report['exact_halfvec_recall']:.4f}", flush=True)
            conn.execute("SET maintenance_work_mem = '2GB'")
            for m, efc in settings:
                for kind, (expr, order_by) in KINDS.items():
                    name = f"vecs_{kind}_{m}_{efc}"
                    start = time.perf_counter()
                    conn.execute(
                        f"CREATE INDEX {name} ON vecs USING hnsw ({expr}) WITH (m = {m}, ef_construction = {efc})"
                    )
                    build_s = time.perf_counter() - start
                    cur = conn.execute("SELECT pg_relation_size(%s::regclass)", (name,))
                    size = int(cur.fetchone()[0])  # type: ignore[index]
                    assert _uses_index(conn, order_by, queries[0], name), f"{name} not used by the planner"
                    _ask(conn, order_by, queries[:20], EF_GRID[0])  # warm-up, not counted
                    curve, p50 = {}, {}
                    for ef in EF_GRID:
                        hits, p50[ef] = _ask(conn, order_by, queries, ef)
                        curve[ef] = recall(hits)
                    start = time.perf_counter()
                    for i, v in enumerate(extra, rows + 1_000_000 * len(report["indexes"])):
                        conn.execute("INSERT INTO vecs (id, embedding) VALUES (%s, %s)", (i, v))
                    insert_ms = (time.perf_counter() - start) / len(extra) * 1000
                    conn.execute("DELETE FROM vecs WHERE id >= %s", (rows,))
                    row = {
                        "kind": kind,
                        "insert_ms": insert_ms,
                        "m": m,
                        "ef_construction": efc,
                        "build_s": build_s,
                        "index_bytes": size,
                        "recall": curve,
                        "p50_ms": p50,
                        "ef_for": {str(t): ef_needed(curve, t) for t in (0.95, 0.98, 0.99)},
                    }
                    report["indexes"].append(row)
                    print(
                        f"halfvec: {kind} {m}/{efc}: build {build_s:.0f} s, {size / 2**20:.0f} MiB, "
                        + ", ".join(f"ef {ef} {curve[ef]:.3f}" for ef in EF_GRID),
                        flush=True,
                    )
                    conn.execute(f"DROP INDEX {name}")
    finally:
        pg.stop()
    return report


def markdown(report: dict[str, Any], command: str) -> str:
    lines = [
        "# `halfvec` against `vector` for a memory tier's HNSW index",
        "",
        f"Command: `{command}`  ",
        f"{report['rows']} rows of 384-d unit vectors around 200 Gaussian centres (noise norm ~1.0, the load"
        f" benchmark's), {report['queries']} queries (rows perturbed by noise norm ~0.3); recall@10 against an"
        " exact float64 scan; one connection, queries one after another, iterative scan `relaxed_order`; each"
        " index built alone (the other dropped), `maintenance_work_mem` 2GB; insert = 500 more rows, one"
        " statement each, into the built index (wall ms a row).",
        "",
        f"Table (heap, `vector(384)`): {report['table_bytes'] / 2**20:.0f} MiB. Exact search over"
        f" `embedding::halfvec(384)`: recall@10 {report['exact_halfvec_recall']:.4f} (what halfvec's precision"
        " alone loses).",
        "",
        "| index | m / efConstruction | build s | size MiB | "
        + " | ".join(f"recall@10 ef {ef}" for ef in EF_GRID)
        + " | ef for 0.95 / 0.98 / 0.99 | p50 ms at ef 48 / 128 | insert ms a row |",
        "|---|---|---|---|" + "---|" * len(EF_GRID) + "---|---|---|",
    ]
    for r in report["indexes"]:
        ef_for = " / ".join(str(r["ef_for"][t]) for t in ("0.95", "0.98", "0.99"))
        p50 = r["p50_ms"]
        lines.append(
            f"| {r['kind']} | {r['m']} / {r['ef_construction']} | {r['build_s']:.0f} |"
            f" {r['index_bytes'] / 2**20:.0f} | "
            + " | ".join(f"{r['recall'][ef]:.3f}" for ef in EF_GRID)
            + f" | {ef_for} | {p50[48]:.2f} / {p50[128]:.2f} | {r.get('insert_ms', float('nan')):.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--settings", default="16/64,24/128")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--name", default="")
    args = parser.parse_args()
    settings = [(int(m), int(efc)) for m, efc in (s.split("/") for s in args.settings.split(","))]
    report = run(args.rows, settings, args.queries, args.seed)
    command = "python -m benchmarks.halfvec " + " ".join(
        f"--{k} {v}" for k, v in (("rows", args.rows), ("settings", args.settings), ("queries", args.queries))
    )
    path = write_results("halfvec" + (f"-{args.name}" if args.name else ""), markdown(report, command), report)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
