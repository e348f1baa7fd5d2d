"""``python -m service`` as a subprocess against external backends, for tests
that kill Braid itself.

:class:`ServiceProcess` writes one YAML (a fresh database in the session
Postgres, its own alias in the session Typesense, an agent and an admin key
for one tenant) and starts the service with it; starting it again with the
same config is a restart. The output of every run goes to a log file under
the home directory (a pipe nobody reads would block the service once full),
and :meth:`ServiceProcess.output` reads it back for failure messages.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import IO, Any

import httpx
import psycopg

from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense, free_port
from tests.api.conftest import fresh_database

__all__ = ["ADMIN_KEY", "AGENT_KEY", "TENANT", "ServiceProcess"]

ROOT = Path(__file__).resolve().parents[2]

TENANT = "tenant-a"
AGENT_KEY = "agent-key-crash-tenant-a-0123"
ADMIN_KEY = "admin-key-crash-tenant-a-0123"


class ServiceProcess:
    """One Braid service, run and re-run as a subprocess on a fixed port."""

    def __init__(
        self, home: Path, postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, extra_yaml: str = ""
    ) -> None:
        self.home = home
        self.dsn = fresh_database(postgres)
        self.alias = f"crash_{uuid.uuid4().hex[:10]}"
        self.typesense = typesense
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = home / "braid.yaml"
        self.config.write_text(
            f"postgres:\n  dsn: '{self.dsn}'\n"
            f"typesense:\n  nodes: ['{typesense.url}']\n  apiKey: '{typesense.api_key}'\n"
            f"  collection: {self.alias}\n"
            "auth:\n  keys:\n"
            f"    - {{tenant: {TENANT}, role: agent, key: {AGENT_KEY}}}\n"
            f"    - {{tenant: {TENANT}, role: admin, key: {ADMIN_KEY}}}\n" + extra_yaml
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0
        self._log: IO[bytes] | None = None

    # --- lifecycle ------------------------------------------------------------

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self._close_log()
        self.runs += 1
        env = {k: v for k, v in os.environ.items() if not k.startswith("BRAID_")}
        env.update(BRAID_HOME=str(self.home), BRAID_PORT=str(self.port), BRAID_CONFIG=str(self.config))
        self._log = (self.home / f"run-{self.runs}.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service"],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_healthy(self, timeout: float = 180) -> float:
        """Wait for ``GET /health`` to answer 200; returns the seconds waited."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"service exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"service not healthy after {timeout}s:\n{self.output()}")

    def sigkill(self) -> None:
        """SIGKILL the service (no shutdown code runs) and reap it."""
        assert self.proc is not None and self.proc.poll() is None, "not running"
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._close_log()

    def stop(self) -> str:
        """Stop the service if it runs (SIGINT, then SIGKILL after 60 s); returns its output."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self._close_log()
        return self.output()

    def output(self, run: int | None = None) -> str:
        """The output of run number ``run`` (1, 2, ...; default the latest)."""
        path = self.home / f"run-{run or self.runs}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    # --- talking to it ----------------------------------------------------------

    @staticmethod
    def auth(key: str = AGENT_KEY) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    def client(self, timeout: float = 60) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, timeout=timeout)

    def typesense_client(self) -> httpx.AsyncClient:
        """Straight to Typesense, not through Braid."""
        return httpx.AsyncClient(
            base_url=self.typesense.url,
            headers={"X-TYPESENSE-API-KEY": self.typesense.api_key},
            timeout=30,
        )

    async def pg(self) -> psycopg.AsyncConnection[Any]:
        """A connection to the service's database (superuser: sees every tenant)."""
        return await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
