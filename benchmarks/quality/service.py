"""Start ``python -m service`` with one agent key per tenant.

A :class:`benchmarks.common.Service` whose config is the shipped
``config/braid.yaml`` (or ``--config``) plus an ``auth.keys`` list, so each
tenant is reached with its own key.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import httpx
import yaml

from benchmarks.common import ROOT, Service

__all__ = ["TenantService"]


class TenantService(Service):
    """The service with ``headers[tenant]`` holding each tenant's agent key."""

    def __init__(self, tenants: list[str], config: Path = ROOT / "config" / "braid.yaml") -> None:
        keys = {t: secrets.token_urlsafe(24) for t in tenants}  # 32 characters each
        cfg = yaml.safe_load(config.read_text())
        cfg.setdefault("auth", {})["keys"] = [{"tenant": t, "role": "agent", "key": k} for t, k in keys.items()]
        self.headers_by_tenant = {t: {"Authorization": f"Bearer {k}"} for t, k in keys.items()}
        super().__init__(config_text=yaml.safe_dump(cfg, sort_keys=False), prefix="braid-quality-")

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
