"""``python -m benchmarks.faults [--soak-minutes N]``: see ``benchmarks/faults/__init__.py``.

1. A fresh ledger (``benchmarks/results/faults-ledger.jsonl``).
2. ``pytest -m "faults or slow_faults" tests`` with ``BRAID_FAULT_LEDGER``
   pointing at it; its output streams through, its exit status and summary
   line are kept (``faults-run.json``).
3. The soak (unless ``--soak-minutes 0``), which appends its own scenario.
4. The report; its last line is the ``faults: ...`` line, and the exit
   status is non-zero if pytest failed or anything that must be zero is not.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import ROOT

from . import report
from .ledger import Ledger
from .soak import SoakSettings, run_soak
from .soak_report import write_outputs

__all__ = ["main", "pytest_summary", "run_pytest"]

PYTEST_ARGS = ["-q", "-p", "no:cacheprovider", "-m", "faults or slow_faults", "tests"]
#: pytest -q's closing line, e.g. "12 passed, 3 deselected in 45.20s" (maybe between = signs).
_SUMMARY = re.compile(r"^=*\s*(\d+ \w+.* in [\d.]+s.*?)\s*=*$")


def pytest_summary(output: str) -> str:
    """The last summary line of pytest's output ('' if there is none)."""
    for line in reversed(output.splitlines()):
        m = _SUMMARY.match(line.strip())
        if m:
            return m.group(1)
        if line.strip().startswith("no tests ran"):
            return line.strip("= ")
    return ""


def run_pytest(ledger: Path) -> tuple[int, str]:
    """Run the fault tests, streaming their output; return (exit status, summary line)."""
    env = dict(os.environ, BRAID_FAULT_LEDGER=str(ledger))
    cmd = [sys.executable, "-m", "pytest", *PYTEST_ARGS]
    print(f"faults: {shlex.join(cmd[2:])}", flush=True)
    tail: list[str] = []
    with subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            tail = (tail + [line])[-50:]
    return proc.returncode, pytest_summary("".join(tail))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.faults", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--soak-minutes", type=float, default=10.0, help="0 skips the soak")
    parser.add_argument("--skip-pytest", action="store_true", help="only the soak and the report (debugging)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    ledger = report.LEDGER
    ledger.parent.mkdir(parents=True, exist_ok=True)
    ledger.unlink(missing_ok=True)
    ledger.touch()
    for stale in ("soak.json", "soak.md", "soak.png"):
        (ledger.parent / stale).unlink(missing_ok=True)

    command = "python -m benchmarks.faults " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.skip_pytest:
        status, summary = None, "skipped (--skip-pytest)"
    else:
        status, summary = run_pytest(ledger)
    pytest_s = time.monotonic() - started
    run = {"command": command.strip(), "pytest_exit": status, "pytest_summary": summary, "pytest_s": round(pytest_s, 1)}
    report.RUN.write_text(json.dumps(run, indent=1) + "\n")
    print(f"faults: pytest {summary or '(no summary line)'} (exit {status}) after {pytest_s:.0f} s", flush=True)

    if args.soak_minutes > 0:
        try:
            result = run_soak(SoakSettings(minutes=args.soak_minutes), Ledger(str(ledger)), command=command)
            write_outputs(result, ledger.parent)
            run["soak"] = {
                "error": result["error"],
                "memory_flat": result["memory"]["flat"],
                "servers_died": sorted(result["servers_died"]),
                "leftover_processes": len(result["leftover_processes"]),
            }
            print(f"faults: soak {result['scenario']['outcome']}", flush=True)
        except Exception as exc:  # the report and its closing line still come
            run["soak"] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"faults: soak failed: {run['soak']['error']}", flush=True)
        report.RUN.write_text(json.dumps(run, indent=1) + "\n")

    print(f"faults: done after {time.monotonic() - started:.0f} s", flush=True)
    return report.main()


if __name__ == "__main__":
    sys.exit(main())
