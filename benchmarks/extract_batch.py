"""What spaCy extraction costs a text by how many texts are parsed together.

``python -m benchmarks.extract_batch [--texts 640] [--rounds 3] [--gemm blis|numpy] [--name X]`` loads the
extractor's pipeline in this process and extracts the same texts (LoCoMo
turns, as an agent runtime writes them) in calls of 1, 4, 16 and 64 texts,
the sizes taking turns within each round so a drift of the shared machine
falls on all of them. It is what the extractor's coalescing
(:class:`indexers.embedding.Coalescing`) buys when writes queue for it.
Reports the process CPU per text (median over rounds) and checks that every
size gives each text the same extraction (their SHA-256 is reported, to
compare runs). ``--gemm numpy`` has thinc multiply its matrices with numpy
(OpenBLAS) instead of blis, its default and what the service runs. Writes
``benchmarks/results/extract-batch[-<name>].{md,json}`` and prints one line::

    extract-batch: 1=<ms> 4=<ms> 16=<ms> 64=<ms> ms CPU/text, same=<bool>
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
from typing import Any

import msgspec

from benchmarks.common import LOCOMO_DATA, write_results
from benchmarks.quality.locomo import conversation_memories, load_conversations
from indexers.spacy_extractor import PIPE_BATCH, extract_doc, load_pipeline

SIZES = (1, 4, 16, 64)


def texts_of(count: int) -> list[str]:
    """The first ``count`` turns' texts of the LoCoMo conversations, in order."""
    texts: list[str] = []
    for conversation in load_conversations(LOCOMO_DATA):
        texts += [m["content"] for m in conversation_memories(conversation)]
        if len(texts) >= count:
            break
    return texts[:count]


def extract(nlp: Any, texts: list[str], size: int) -> tuple[float, list[Any]]:
    """Process CPU seconds to extract ``texts`` in calls of ``size``, and the extractions."""
    out: list[Any] = []
    start = time.process_time()
    for i in range(0, len(texts), size):
        docs = nlp.pipe(texts[i : i + size], batch_size=PIPE_BATCH)
        out += [extract_doc(doc) for doc in docs]
    return time.process_time() - start, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=640)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gemm", choices=("blis", "numpy"), default="blis", help="thinc's matrix products")
    parser.add_argument("--name", default="")
    args = parser.parse_args(argv)
    if args.gemm == "numpy":
        from thinc.api import NumpyOps, set_current_ops

        set_current_ops(NumpyOps(use_blis=False))
    texts = texts_of(args.texts)
    nlp = load_pipeline()
    extract(nlp, texts[:64], 64)  # warm-up
    cpu: dict[int, list[float]] = {size: [] for size in SIZES}
    reference: list[Any] | None = None
    same = True
    for r in range(args.rounds):
        for size in SIZES[r % len(SIZES) :] + SIZES[: r % len(SIZES)]:
            seconds, out = extract(nlp, texts, size)
            cpu[size].append(seconds * 1000.0 / len(texts))
            got = msgspec.to_builtins(out)
            reference = reference if reference is not None else got
            same = same and got == reference
            print(f"round {r + 1}: {size} a call: {cpu[size][-1]:.2f} ms CPU a text", file=sys.stderr)
    medians = {size: round(statistics.median(v), 2) for size, v in cpu.items()}
    digest = hashlib.sha256(msgspec.msgpack.encode(reference)).hexdigest()
    rows = "\n".join(f"| {size} | {medians[size]} | {round(medians[size] / medians[SIZES[-1]], 2)} |" for size in SIZES)
    head = "  \n".join(
        [
            f"Command: `python -m benchmarks.extract_batch --texts {args.texts} --rounds {args.rounds}"
            f" --gemm {args.gemm}{f' --name {args.name}' if args.name else ''}`",
            f"Texts: the first {len(texts)} LoCoMo turns (mean {statistics.mean(len(t) for t in texts):.0f} characters);",
            "spaCy's small English pipeline as `graph.extract: spacy` runs it, in this process;",
            f"thinc's matrix products: {args.gemm} (the service: blis);",
            f"CPU: this process' CPU time, median over {args.rounds} rounds (the sizes take turns).",
        ]
    )
    markdown = f"""# What extraction costs a text, by texts parsed together

{head}

| texts a call | ms CPU a text | against {SIZES[-1]} a call |
|---|---|---|
{rows}

Every size gave every text the same extraction: **{same}**. SHA-256 of the
extractions (msgpack): `{digest}`.
"""
    data = {
        "texts": len(texts),
        "rounds": args.rounds,
        "gemm": args.gemm,
        "cpu_ms": cpu,
        "median_ms": medians,
        "same": same,
        "sha256": digest,
    }
    write_results(f"extract-batch-{args.name}" if args.name else "extract-batch", markdown, data)
    print(f"extract-batch: {' '.join(f'{s}={medians[s]}' for s in SIZES)} ms CPU/text, same={same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
