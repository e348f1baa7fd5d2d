"""Start ``python -m service`` with one agent key per tenant and an admin key.

A :class:`benchmarks.common.Service` whose config is the shipped
``config/braid.yaml`` (or ``--config``) with the ``--set`` overrides applied
and an ``auth.keys`` list, so each tenant is reached with its own key and
``/admin`` (config reloads) with the admin key.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.common import ROOT, Service

from .tuning import Override, apply_sets

__all__ = ["TenantService"]


#: The admin key's tenant (it acts on no tenant's memories here).
ADMIN_TENANT = "bench-admin"


class TenantService(Service):
    """The service with ``headers_by_tenant[tenant]`` holding each tenant's agent
    key, ``admin_headers`` the admin key's, and ``config`` the config it started
    with (a mapping, as written to its file)."""

    def __init__(
        self, tenants: list[str], config: Path = ROOT / "config" / "braid.yaml", sets: Sequence[Override] = ()
    ) -> None:
        keys = {t: secrets.token_urlsafe(24) for t in tenants}  # 32 characters each
        admin = secrets.token_urlsafe(24)
        cfg = apply_sets(yaml.safe_load(config.read_text()), sets)
        cfg.setdefault("auth", {})["keys"] = [{"tenant": t, "role": "agent", "key": k} for t, k in keys.items()] + [
            {"tenant": ADMIN_TENANT, "role": "admin", "key": admin}
        ]
        self.config: dict[str, Any] = cfg
        self.headers_by_tenant = {t: {"Authorization": f"Bearer {k}"} for t, k in keys.items()}
        self.admin_headers = {"Authorization": f"Bearer {admin}"}
        super().__init__(config_text=yaml.safe_dump(cfg, sort_keys=False), prefix="braid-quality-")

    def write_config(self, config: Mapping[str, Any]) -> None:
        """Replace the service's config file (read again at the next reload)."""
        (self.home / "braid.yaml").write_text(yaml.safe_dump(dict(config), sort_keys=False))

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
