"""``python -m benchmarks.load [--size N]``: see ``benchmarks/load/__init__.py``."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

from benchmarks.quality.tuning import parse_set

from .corpus import build_corpus, describe
from .growth import write_growth
from .report import summary_line, write_report
from .run import run


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.load", description=__doc__)
    parser.add_argument("--size", type=int, default=10000, help="memories in the big tenant")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--batch", type=int, default=200, help="memories per write (<= 256, body < 4 MiB)")
    parser.add_argument("--writers", type=int, default=3, help="concurrent bulk writers")
    parser.add_argument("--seconds", type=float, default=10.0, help="per recall-latency row")
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--fresh-rates", default="50,100")
    parser.add_argument("--fresh-seconds", type=float, default=10.0, help="per freshness and steady-write rate")
    parser.add_argument("--steady-rates", default="50", help="single writes/s with nothing probing them")
    parser.add_argument("--fresh-check-every", type=int, default=5, help="pgvector/graph checked on 1 write in N")
    parser.add_argument("--raw-sample", type=int, default=20000, help="documents in the raw Typesense import")
    parser.add_argument(
        "--set", action="append", default=[], type=parse_set, help="dotted.key=value over the shipped config"
    )
    parser.add_argument(
        "--place-at",
        type=int,
        default=None,
        help="run the placement job once the big tenant holds this many memories (default: after the load)",
    )
    parser.add_argument(
        "--import",
        dest="bulk_import",
        action="store_true",
        help="prepare the big tenant with an `import` admin job before the load (placed after it)",
    )
    parser.add_argument(
        "--services",
        type=int,
        default=1,
        help="service processes sharing the backends; the recall rows with vectors supplied go to them round robin",
    )
    parser.add_argument(
        "--name", default=None, help="report as load-<size>-<name> (default load-<size>, which growth reads)"
    )
    args = parser.parse_args()
    if args.services < 1:
        parser.error(f"--services must be at least 1, got {args.services}")
    started = time.perf_counter()
    corpus = build_corpus(args.size, seed=args.seed)
    corpus_s = time.perf_counter() - started
    report = asyncio.run(
        run(
            corpus,
            writers=args.writers,
            batch=min(args.batch, 256),
            seconds=args.seconds,
            clients=tuple(int(c) for c in args.clients.split(",")),
            fresh_rates=tuple(int(r) for r in args.fresh_rates.split(",")),
            fresh_seconds=args.fresh_seconds,
            fresh_check_every=args.fresh_check_every,
            raw_sample=args.raw_sample,
            steady_rates=tuple(int(r) for r in args.steady_rates.split(",")),
            sets=args.set,
            place_at=args.place_at,
            bulk_import=args.bulk_import,
            services=args.services,
        )
    )
    report.update(
        size=args.size,
        seconds=args.seconds,
        command="python -m benchmarks.load " + " ".join(sys.argv[1:]),
        machine=f"{os.cpu_count()} cores (client, service, Postgres and Typesense share them)",
        corpus=describe(corpus),
        corpus_s=corpus_s,
        wall_s=time.perf_counter() - started,
    )
    print(f"load: report at {write_report(report, args.name)}")
    if args.name is None:  # growth reads load-<size> reports only
        print(f"load: growth across sizes at {write_growth()}")
    print(summary_line(report))


if __name__ == "__main__":
    main()
