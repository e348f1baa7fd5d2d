"""Keys: held as digests, found by digest and compared in constant time, rotated by a config
reload without a restart; only admin keys reach /admin; a per-key rate limit
answers 429 with Retry-After."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

import service.auth as auth
from config import load_config
from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense
from service.auth import Keyring, Principal, RateLimiter, default_keys, digest

from . import conftest
from .conftest import ADMIN_A, AGENT_A, AGENT_B, Braid, make_app, serve

pytestmark = pytest.mark.anyio

OLD = "old-agent-key-0123456789abcdef"
NEW = "new-agent-key-0123456789abcdef"
ADMIN = "rotation-admin-key-0123456789"


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def keys_yaml(alias: str, *entries: str) -> str:
    lines = "".join(f"\n    - {e}" for e in entries)
    return f"typesense:\n  collection: {alias}\nauth:\n  keys:{lines}\n"


async def test_a_key_is_rotated_by_a_config_reload_without_restart(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any, tmp_path: Path
) -> None:
    path = tmp_path / "braid.yaml"
    admin = f"{{tenant: rot, role: admin, sha256: {sha(ADMIN)}}}"
    old = f"{{tenant: rot, role: agent, key: {OLD}}}"
    new = f"{{tenant: rot, role: agent, sha256: {sha(NEW)}}}"
    path.write_text(keys_yaml("x", admin, old))
    app, dsn, alias = make_app(postgres, typesense, embedder, load_config(path), str(path))
    async with serve(app) as client:
        app.state.keyring = Keyring.from_config(app.state.runtime.engine.config)
        braid = Braid(client=client, app=app, dsn=dsn, alias=alias)

        async def status(key: str) -> int:
            r = await braid.post("/v1/recall", {"query": "what is the plan"}, key)
            return r.status_code

        ids = await braid.remember({"content": "The plan is to ship on Friday"}, key=OLD)
        assert (await status(OLD), await status(NEW)) == (200, 401)

        path.write_text(keys_yaml(alias, admin, old, new))
        assert (await braid.post("/admin/config/reload", {}, ADMIN)).status_code == 200
        assert (await status(OLD), await status(NEW)) == (200, 200)

        path.write_text(keys_yaml(alias, admin, new))
        assert (await braid.post("/admin/config/reload", {}, ADMIN)).status_code == 200
        assert (await status(OLD), await status(NEW)) == (401, 200)
        # Same tenant: the new key sees what the old one wrote.
        out = await braid.recall("what is the plan", key=NEW, sources=["pgvector"])
        assert [i["id"] for i in out["items"]] == ids

        # A reload that fails keeps the running keys.
        path.write_text(keys_yaml(alias, admin, "{tenant: rot, role: agent, key: short}"))
        r = await braid.post("/admin/config/reload", {}, ADMIN)
        assert r.status_code == 400
        assert (await status(NEW)) == 200


def test_the_keyring_holds_digests_and_compares_once(monkeypatch: pytest.MonkeyPatch) -> None:
    ring = Keyring()
    keys = [f"key-number-{i}-0123456789abcdef" for i in range(2000)]
    for i, key in enumerate(keys):
        ring.add(key, tenant=f"t{i}", role="agent")
    state = repr(vars(ring))
    assert not any(key in state for key in keys)
    assert all(digest(key) in state for key in keys)

    calls: list[tuple[str, str]] = []
    real = auth.hmac.compare_digest

    def counting(a: str, b: str) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    assert ring.lookup(keys[0]) == Principal(tenant="t0", role="agent", key_id=digest(keys[0]))
    assert ring.lookup(keys[-1]) == Principal(tenant="t1999", role="agent", key_id=digest(keys[-1]))
    assert ring.lookup("not-a-key-at-all-0123456789") is None
    assert ring.lookup(keys[7][:-1]) is None
    # One constant-time comparison, the presented key's digest against what it
    # found, whether the key is first, last, unknown or nearly right: the work
    # does not grow with the keys held (a tenant each).
    assert len(calls) == 4
    assert all(b == digest(k) for (_, b), k in zip(calls, [keys[0], keys[-1]], strict=False))


def test_generated_keys_are_shown_once_and_stored_as_digests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BRAID_API_KEY", raising=False)
    monkeypatch.delenv("BRAID_ADMIN_KEY", raising=False)
    keys, messages = default_keys(tmp_path, "default")
    assert len(messages) == 2
    shown = [m.rsplit(": ", 1)[1] for m in messages]
    stored = json.loads((tmp_path / "keys.json").read_text())
    assert stored == {"agent": {"sha256": digest(shown[0])}, "admin": {"sha256": digest(shown[1])}}
    assert not any(key in (tmp_path / "keys.json").read_text() for key in shown)
    assert (tmp_path / "keys.json").stat().st_mode & 0o777 == 0o600
    assert {who.role for who in keys.values()} == {"agent", "admin"}

    again, messages = default_keys(tmp_path, "default")
    assert messages == [] and again == keys

    # keys.json from an older Braid (keys in clear) is rewritten with digests.
    (tmp_path / "keys.json").write_text(json.dumps({"agent": shown[0], "admin": shown[1]}))
    migrated, messages = default_keys(tmp_path, "default")
    assert messages == [] and migrated == keys
    assert json.loads((tmp_path / "keys.json").read_text()) == stored


def test_the_rate_limiter_is_a_token_bucket_per_key() -> None:
    now = [100.0]
    limiter = RateLimiter(clock=lambda: now[0])
    assert [limiter.take("a", 2.0, 3) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.take("a", 2.0, 3) == pytest.approx(0.5)
    assert limiter.take("b", 2.0, 3) == 0.0  # another key has its own bucket
    now[0] += 0.5
    assert limiter.take("a", 2.0, 3) == 0.0
    assert limiter.take("a", 2.0, 3) == pytest.approx(0.5)
    now[0] += 60
    assert [limiter.take("a", 2.0, 3) for _ in range(4)][-1] > 0  # refills to the burst, no more
    assert limiter.take("a", 0.0, 1) == 0.0  # 0 = no limit


async def test_over_the_rate_a_key_gets_429_with_retry_after(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any
) -> None:
    cfg = conftest.test_config("x")
    cfg = msgspec.structs.replace(cfg, limits=msgspec.structs.replace(cfg.limits, rate_per_second=0.5, rate_burst=3))
    app, dsn, alias = make_app(postgres, typesense, embedder, cfg)
    async with serve(app) as client:
        braid = Braid(client=client, app=app, dsn=dsn, alias=alias)
        body = {"query": "anything"}
        codes = [(await braid.post("/v1/recall", body, AGENT_A)).status_code for _ in range(3)]
        assert codes == [200, 200, 200]
        r = await braid.post("/v1/recall", body, AGENT_A)
        assert r.status_code == 429
        # One token at 0.5/s: at most 2 s away (less if the first three were slow).
        assert r.headers["retry-after"] in ("1", "2")
        assert r.json()["detail"] == (
            "rate limit: this key may send 0.5 requests a second (bursts of 3); retry after the time in Retry-After"
        )
        # Other keys, and unauthenticated probes, are not counted against it.
        assert (await braid.post("/v1/recall", body, AGENT_B)).status_code == 200
        assert (await client.get("/health")).status_code == 200


async def test_only_admin_keys_reach_any_admin_route(braid: Braid) -> None:
    admin_paths = sorted(
        {
            (method, route.path)
            for route in braid.app.routes
            for method in route.methods
            if route.path.startswith("/admin") and method not in ("HEAD", "OPTIONS")
        }
    )
    assert len(admin_paths) >= 3
    for method, path in admin_paths:
        url = path.replace("{job_id:str}", "some-job")
        body = {"target": "typesense"} if method == "POST" else None
        for key, expected in ((None, 401), (AGENT_A, 403), (AGENT_B, 403)):
            headers = {} if key is None else braid.headers(key)
            r = await braid.client.request(method, url, json=body, headers=headers)
            assert r.status_code == expected, (method, path, key, r.text)
        r = await braid.client.request(method, url, json=body, headers=braid.headers(ADMIN_A))
        # Reached: answered by the handler (a reload here refuses to change the
        # test's collection with a 400), not by the auth check.
        assert r.status_code in (200, 202, 400, 404), (method, path, r.text)
