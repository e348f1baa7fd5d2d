"""API keys and the per-key rate limit. The tenant comes from the key only.

Keys are held as SHA-256 digests only: a presented key is hashed, its digest
looked up in a table of the known ones, and the entry found (or a stand-in)
compared with it in constant time, so a lookup costs the same with 10 keys
or 100,000 (one tenant, one key: a scan of every digest took 0.43 ms a
request at 10,000 keys). The keys of ``auth.keys`` (in
clear or as ``sha256``) follow the running config: a reload (SIGHUP or
``POST /admin/config/reload``) adds and removes keys without a restart, which
is how a key is rotated (add the new key, reload, move the agents over,
remove the old key, reload).

In the embedded default the agent and admin keys come from ``BRAID_API_KEY``
/ ``BRAID_ADMIN_KEY``, or are generated once, printed once, and kept as
digests in ``$BRAID_HOME/keys.json``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal

import msgspec

from config import BraidConfig

__all__ = ["Keyring", "Principal", "RateLimiter", "default_keys", "digest", "retry_after_header"]

Role = Literal["agent", "admin"]


class Principal(msgspec.Struct, frozen=True):
    tenant: str
    role: Role
    #: The key's SHA-256 digest: what the rate limit counts by (never the key).
    key_id: str = ""


#: What an unknown key's digest is compared with: no SHA-256 digest is 64 'x's.
_NO_DIGEST = "x" * 64


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class Keyring:
    """Digest -> principal. Fixed entries (``add``) plus, when built with
    :meth:`from_config`, the keys of whichever config is current."""

    def __init__(self) -> None:
        self._fixed: dict[str, Principal] = {}
        self._get_config: Callable[[], BraidConfig] | None = None
        self._built_from: BraidConfig | None = None
        self._stale = True
        self._keys: dict[str, Principal] = {}

    def add(self, key: str | None = None, *, tenant: str, role: Role, sha256: str | None = None) -> None:
        d = sha256 if sha256 is not None else digest(key or "")
        self._fixed[d] = Principal(tenant=tenant, role=role, key_id=d)
        self._stale = True  # rebuild the merged table on the next lookup

    @classmethod
    def from_config(
        cls, get_config: Callable[[], BraidConfig], extra: Mapping[str, Principal] | None = None
    ) -> Keyring:
        """``extra``: digest -> principal, kept across reloads (the embedded default keys)."""
        ring = cls()
        ring._get_config = get_config
        for d, who in (extra or {}).items():
            ring.add(sha256=d, tenant=who.tenant, role=who.role)
        return ring

    def _table(self) -> dict[str, Principal]:
        cfg = self._get_config() if self._get_config is not None else None
        if self._stale or cfg is not self._built_from:
            keys = dict(self._fixed)
            for k in cfg.auth.keys if cfg is not None else ():
                d = k.sha256 if k.sha256 is not None else digest(k.key or "")
                keys[d] = Principal(tenant=k.tenant, role=k.role, key_id=d)
            self._keys = keys
            self._built_from = cfg
            self._stale = False
        return self._keys

    def lookup(self, presented: str) -> Principal | None:
        """The principal of ``presented``, or None.

        What the table lookup's timing depends on is the presented key's
        digest (through Python's per-process randomised string hash): to
        steer it toward a stored digest an attacker would need SHA-256
        preimages, and a digest learnt would not authenticate anyway. The
        final comparison is constant-time, and made once whether the key is
        known or not."""
        d = digest(presented)
        who = self._table().get(d)
        matched = hmac.compare_digest(who.key_id if who is not None else _NO_DIGEST, d)
        return who if matched else None

    def __len__(self) -> int:
        return len(self._table())


class RateLimiter:
    """A token bucket per key: ``rate`` requests a second, ``burst`` at once.

    Buckets are kept per process and only for keys that authenticated, so
    their number is bounded by the keyring. ``take`` returns 0.0 when the
    request may go, else the seconds until it could.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, key_id: str, rate: float, burst: int) -> float:
        if rate <= 0:
            return 0.0
        now = self._clock()
        tokens, last = self._buckets.get(key_id, (float(burst), now))
        tokens = min(float(burst), tokens + (now - last) * rate)
        if tokens >= 1.0:
            self._buckets[key_id] = (tokens - 1.0, now)
            return 0.0
        self._buckets[key_id] = (tokens, now)
        return (1.0 - tokens) / rate


def retry_after_header(seconds: float) -> str:
    """``Retry-After`` in whole seconds, rounded up, at least 1."""
    return str(max(1, math.ceil(seconds)))


def default_keys(home: Path, tenant: str) -> tuple[dict[str, Principal], list[str]]:
    """The embedded default keys as digest -> principal, and lines to print
    for the keys generated now (the only time they are shown).

    ``keys.json`` holds digests only; a file written by an older Braid (keys in
    clear) is rewritten with their digests.
    """
    path = home / "keys.json"
    stored: dict[str, object] = json.loads(path.read_text()) if path.exists() else {}
    messages = []
    keys: dict[str, Principal] = {}
    changed = False
    for env, role in (("BRAID_API_KEY", "agent"), ("BRAID_ADMIN_KEY", "admin")):
        entry = stored.get(role)
        if isinstance(entry, str):  # an older keys.json: the key in clear
            stored[role] = entry = {"sha256": digest(entry)}
            changed = True
        if os.environ.get(env):
            d = digest(os.environ[env])
        elif isinstance(entry, dict) and isinstance(entry.get("sha256"), str):
            d = entry["sha256"]
        else:
            key = f"braid_{role}_{secrets.token_urlsafe(24)}"
            d = digest(key)
            stored[role] = {"sha256": d}
            changed = True
            messages.append(
                f"generated {role} key, shown only now ({path} keeps its SHA-256; set {env} to choose your own): {key}"
            )
        keys[d] = Principal(tenant=tenant, role=role, key_id=d)  # type: ignore[arg-type]
    if changed:
        home.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(stored, indent=2))
        path.chmod(0o600)
    return keys, messages
