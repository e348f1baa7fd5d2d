"""``python -m benchmarks.quality``: see the package docstring."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from . import __doc__ as DOC
from .report import summary_line, write_outputs
from .run import add_arguments, run


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.quality", description=DOC, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    args = parser.parse_args()
    start = time.perf_counter()
    report = asyncio.run(run(args))
    report["elapsed_s"] = time.perf_counter() - start
    report["command"] = " ".join(["python -m benchmarks.quality", *sys.argv[1:]])
    for path in write_outputs(report, args.name):
        print(f"wrote {path}", file=sys.stderr)
    print(summary_line(report))


if __name__ == "__main__":
    main()
