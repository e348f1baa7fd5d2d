"""``python -m benchmarks.quality``: see the package docstring."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from benchmarks.common import BEAM_DATA, LOCOMO_DATA, LONGMEMEVAL_DATA

from . import __doc__ as DOC
from .report import summary_line, write_outputs
from .run import add_arguments, run
from .suites import SUITES, add_suite_arguments, run_suite
from .suites import write_outputs as write_suite_outputs

DEFAULT_DATA = {"locomo": LOCOMO_DATA, "longmemeval": LONGMEMEVAL_DATA, "beam": BEAM_DATA}


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.quality", description=DOC, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    add_suite_arguments(parser)
    args = parser.parse_args()
    args.data = args.data or DEFAULT_DATA[args.suite]
    command = " ".join(["python -m benchmarks.quality", *sys.argv[1:]])
    start = time.perf_counter()
    if args.suite == "locomo":
        report = asyncio.run(run(args))
        report["elapsed_s"] = time.perf_counter() - start
        report["command"] = command
        paths = write_outputs(report, args.name or "quality")
        line = summary_line(report)
    else:
        suite = SUITES[args.suite](args.data, args.limit)
        report = asyncio.run(run_suite(suite, args))
        report["elapsed_s"] = time.perf_counter() - start
        report["command"] = command
        paths = write_suite_outputs(report, suite, args.name or f"quality-{args.suite}")
        line = suite.summary_line(report)
    for path in paths:
        print(f"wrote {path}", file=sys.stderr)
    print(line)


if __name__ == "__main__":
    main()
