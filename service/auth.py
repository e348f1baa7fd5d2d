"""API keys: each maps to one tenant and one role. The tenant comes from the key only.

Keys are held as SHA-256 digests; a presented key is hashed and compared in
constant time. In the embedded default the agent and admin keys come from
``BRAID_API_KEY`` / ``BRAID_ADMIN_KEY`` or are generated once and kept in
``$BRAID_HOME/keys.json`` (mode 0600).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path
from typing import Literal

import msgspec

from config import BraidConfig

__all__ = ["Keyring", "Principal", "default_keys"]

Role = Literal["agent", "admin"]


class Principal(msgspec.Struct, frozen=True):
    tenant: str
    role: Role


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class Keyring:
    def __init__(self) -> None:
        self._keys: dict[str, Principal] = {}

    def add(self, key: str | None = None, *, tenant: str, role: Role, sha256: str | None = None) -> None:
        digest = sha256 if sha256 is not None else _digest(key or "")
        self._keys[digest] = Principal(tenant=tenant, role=role)

    @classmethod
    def from_config(cls, cfg: BraidConfig, extra: dict[str, Principal] | None = None) -> "Keyring":
        ring = cls()
        for k in cfg.auth.keys:
            ring.add(k.key, sha256=k.sha256, tenant=k.tenant, role=k.role)
        for key, who in (extra or {}).items():
            ring.add(key, tenant=who.tenant, role=who.role)
        return ring

    def lookup(self, presented: str) -> Principal | None:
        digest = _digest(presented)
        found = None
        # Compare against every digest so timing does not depend on which key matched.
        for known, who in self._keys.items():
            if hmac.compare_digest(known, digest):
                found = who
        return found

    def __len__(self) -> int:
        return len(self._keys)


def default_keys(home: Path, tenant: str) -> tuple[dict[str, Principal], list[str]]:
    """The embedded default keys, and lines to print for the ones generated now."""
    path = home / "keys.json"
    stored: dict[str, str] = {}
    if path.exists():
        stored = json.loads(path.read_text())
    messages = []
    keys: dict[str, Principal] = {}
    for env, role in (("BRAID_API_KEY", "agent"), ("BRAID_ADMIN_KEY", "admin")):
        key = os.environ.get(env) or stored.get(role)
        if not key:
            key = f"braid_{role}_{secrets.token_urlsafe(24)}"
            stored[role] = key
            messages.append(f"generated {role} key (set {env} to choose your own): {key}")
        keys[key] = Principal(tenant=tenant, role=role)  # type: ignore[arg-type]
    if messages:
        home.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(stored, indent=2))
        path.chmod(0o600)
    return keys, messages
