"""The soak's stack: embedded Postgres and Typesense in a temp dir, and
``python -m service`` as a subprocess pointed at them (external backends),
so the service process's RSS is the service alone.

Everything binds 127.0.0.1. :meth:`SoakStack.close` stops the service with
SIGINT, then Typesense, then Postgres, removes the temp dir and returns the
processes still found using it (killed, and reported: there should be none).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

from benchmarks.common import ROOT, wait_healthy
from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense, free_port
from deploy.supervisor import Supervisor

__all__ = ["SoakStack"]

CONFIG = ROOT / "config" / "braid.yaml"
_PROBLEM = re.compile(r"\b(WARNING|ERROR|CRITICAL)\b|^Traceback")


class SoakStack:
    """``tenants`` each get one agent key: ``headers[tenant]``."""

    def __init__(self, tenants: list[str], service_env: dict[str, str] | None = None) -> None:
        # Not a 0700 dir: Postgres runs as its own system user when we are root.
        self.home = Path(tempfile.mkdtemp(prefix="braid-soak-"))
        self.home.chmod(0o755)
        self.postgres = EmbeddedPostgres(self.home / "postgres")
        self.typesense = EmbeddedTypesense(self.home / "typesense")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.keys = {t: f"soak-{t}-{secrets.token_urlsafe(18)}" for t in tenants}
        self.headers = {t: {"Authorization": f"Bearer {k}"} for t, k in self.keys.items()}
        #: Extra environment for the service (experiments, e.g. OMP_NUM_THREADS=1).
        self.service_env = dict(service_env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.dsn = ""
        self.collection = ""
        self.service_exit: int | None = None
        #: Service log lines at WARNING or above (or tracebacks) written after
        #: it became healthy, kept when the dir is removed.
        self.log_problems: list[str] = []
        self._ready_at = 0
        #: Servers found dead at stop time: kind -> exit code and log tail.
        self.died: dict[str, str] = {}
        self.supervisor: Supervisor | None = None
        #: Typesense crashes the supervisor restarted from (exit code, last error).
        self.typesense_exits: list[str] = []
        self._log: Any = None

    def start(self, timeout: float = 180.0) -> None:
        self.dsn = self.postgres.start()
        self.typesense.start()
        # As `make run` does: a crashed Typesense is restarted, and counted.
        self.supervisor = Supervisor(self.typesense).start()
        cfg = yaml.safe_load(CONFIG.read_text())
        cfg["postgres"]["dsn"] = self.dsn
        cfg["typesense"].update(nodes=[self.typesense.url], apiKey=self.typesense.api_key)
        cfg["server"]["host"] = "127.0.0.1"
        cfg["auth"]["keys"] = [{"tenant": t, "role": "agent", "key": k} for t, k in self.keys.items()]
        self.collection = cfg["typesense"]["collection"]
        config = self.home / "braid.yaml"
        config.write_text(yaml.safe_dump(cfg, sort_keys=False))
        env = {k: v for k, v in os.environ.items() if not k.startswith("BRAID_")}
        env.update(
            BRAID_HOME=str(self.home / "service"),
            BRAID_PORT=str(self.port),
            BRAID_CONFIG=str(config),
            BRAID_LOG_LEVEL="WARNING",
            HF_HUB_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
        )
        env.update(self.service_env)
        self._log = open(self.home / "service.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service"], cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )
        wait_healthy(self.url, self.proc, timeout, self.log_tail)
        self._log.flush()
        self._ready_at = (self.home / "service.log").stat().st_size

    def log_tail(self, chars: int = 4000) -> str:
        if self._log is not None:
            self._log.flush()
        path = self.home / "service.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def service_process(self) -> psutil.Process:
        assert self.proc is not None
        return psutil.Process(self.proc.pid)

    def server_processes(self) -> dict[str, list[psutil.Process]]:
        """Postgres (postmaster and backends) and Typesense processes, by kind."""
        found: dict[str, list[psutil.Process]] = {"postgres": [], "typesense": []}
        # From postmaster.pid itself: EmbeddedPostgres.pid can name the
        # postmaster from before the restart that applies its settings.
        try:
            pg_pid = int((self.postgres.data_dir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pg_pid = None
        if pg_pid:
            try:
                main = psutil.Process(pg_pid)
                found["postgres"] = [main, *main.children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
        if self.typesense.proc is not None:
            try:
                found["typesense"] = [psutil.Process(self.typesense.proc.pid)]
            except psutil.NoSuchProcess:
                pass
        return found

    def _leftovers(self) -> list[psutil.Process]:
        mine = str(self.home)
        left = []
        for p in psutil.process_iter(["cmdline"]):
            try:
                if mine in " ".join(p.info["cmdline"] or []):
                    left.append(p)
            except psutil.Error:
                continue
        return left

    def close(self) -> list[str]:
        """Stop everything in order; return the processes that had to be killed."""
        if self.supervisor is not None:
            self.supervisor.stop()
            self.typesense_exits = list(self.supervisor.exits)
        ts = self.typesense.proc
        if ts is not None and ts.poll() is not None:
            logs = sorted((self.typesense.data_dir / "log").glob("*.log*"))
            tail = logs[-1].read_text(errors="replace")[-1500:] if logs else ""
            self.died["typesense"] = f"exit {ts.returncode}; log tail:\n{tail}"
        if self.proc is not None and self.proc.poll() is not None:
            self.died["service"] = f"exit {self.proc.returncode}; log tail:\n{self.log_tail(1500)}"
        try:
            if self.proc is not None:
                if self.proc.poll() is None:
                    self.proc.send_signal(signal.SIGINT)
                    try:
                        self.proc.wait(60)
                    except subprocess.TimeoutExpired:
                        self.proc.kill()
                        self.proc.wait()
                self.service_exit = self.proc.returncode
        finally:
            try:
                self.typesense.stop()
            finally:
                self.postgres.stop()
        if self._log is not None:
            self._log.close()
        log = self.home / "service.log"
        if log.exists():
            with log.open("rb") as f:
                f.seek(self._ready_at)
                text = f.read().decode(errors="replace")
            self.log_problems = [line for line in text.splitlines() if _PROBLEM.search(line)]
        time.sleep(0.5)
        killed = []
        for p in self._leftovers():
            try:
                killed.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
                p.kill()
            except psutil.Error:
                continue
        shutil.rmtree(self.home, ignore_errors=True)
        return killed
