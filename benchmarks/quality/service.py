"""Start ``python -m service`` with one agent key per tenant.

Like :class:`benchmarks.recall_latency.Service` (whose ``stop`` it reuses):
the embedded stack in a fresh ``BRAID_HOME`` on a free port, but with
``BRAID_CONFIG`` pointing to the shipped ``config/braid.yaml`` plus an
``auth.keys`` list, so each tenant is reached with its own key.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from benchmarks.recall_latency import ROOT, Service
from deploy.embedded import free_port

__all__ = ["TenantService"]


class TenantService(Service):
    """The service with ``headers[tenant]`` holding each tenant's agent key."""

    def __init__(self, tenants: list[str], config: Path = ROOT / "config" / "braid.yaml") -> None:
        self.home = Path(tempfile.mkdtemp(prefix="braid-quality-"))
        self.home.chmod(0o755)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        keys = {t: secrets.token_urlsafe(24) for t in tenants}  # 32 characters each
        cfg = yaml.safe_load(config.read_text())
        cfg.setdefault("auth", {})["keys"] = [{"tenant": t, "role": "agent", "key": k} for t, k in keys.items()]
        self.config = self.home / "braid.yaml"
        self.config.write_text(yaml.safe_dump(cfg, sort_keys=False))
        self.headers_by_tenant = {t: {"Authorization": f"Bearer {k}"} for t, k in keys.items()}

        env = {k: v for k, v in os.environ.items() if not k.startswith("BRAID_")}
        env.update(
            BRAID_HOME=str(self.home),
            BRAID_PORT=str(self.port),
            BRAID_CONFIG=str(self.config),
            BRAID_LOG_LEVEL="WARNING",
        )
        self.log = open(self.home / "service.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service"], cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT
        )
        try:
            self._wait_healthy(180)
        except BaseException:
            self.stop()
            raise

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"service exited:\n{self._log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"service not healthy after {timeout:.0f} s:\n{self._log_tail()}")

    def _log_tail(self) -> str:
        self.log.flush()
        return (self.home / "service.log").read_text(errors="replace")[-4000:]

    def sync_pending(self) -> int | None:
        body = httpx.get(f"{self.url}/health", timeout=5).json()
        pending = body["backends"]["sync"]["pending"]
        return None if pending is None else int(pending)

    def wait_synced(self, timeout: float = 300) -> float:
        """Block until the Typesense outbox is drained; return the seconds waited."""
        start = time.monotonic()
        while self.sync_pending() != 0:
            if time.monotonic() - start > timeout:
                raise RuntimeError(f"outbox not drained after {timeout:.0f} s")
            time.sleep(0.2)
        return time.monotonic() - start
