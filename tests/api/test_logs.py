"""At the default log level the service's output holds no memory content, no
query text and no key: through writes, recalls, deletes, refused requests,
wrong keys, a config reload, and a Typesense that is not there (the warning
paths)."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense, free_port

ROOT = Path(__file__).resolve().parents[2]
AGENT = "log-agent-key-4f1c9a7e2b6d8c3f"
ADMIN = "log-admin-key-9d2e7b1a5c8f3e6a"
WRONG = "log-wrong-key-1a2b3c4d5e6f7a8b"
CONTENT = "Marker zebra-quartz-7731: the vault code is 4412"
QUERY = "Which vault code did the marker zebra-quartz hold?"


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="braid-logs-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run_service(
    home: Path, dsn: str, nodes: list[str], ts_key: str, collection: str
) -> tuple[subprocess.Popen[bytes], str, Path]:
    config = home / "braid.yaml"
    config.write_text(
        f"postgres:\n  dsn: '{dsn}'\n"
        f"typesense:\n  nodes: {nodes}\n  apiKey: '{ts_key}'\n  collection: {collection}\n  timeoutMs: 300\n"
        "sources:\n  typesense: {deadlineMs: 500}\n"
        "auth:\n  keys:\n"
        f"    - {{tenant: logs, role: agent, key: {AGENT}}}\n"
        f"    - {{tenant: logs, role: admin, sha256: {hashlib.sha256(ADMIN.encode()).hexdigest()}}}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("BRAID_")}
    port = free_port()
    env.update(BRAID_HOME=str(home), BRAID_PORT=str(port), BRAID_CONFIG=str(config))
    output = home / f"out-{uuid.uuid4().hex[:6]}.log"
    with output.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, output.read_text()
        try:
            httpx.get(f"{url}/health", timeout=2)
            return proc, url, output
        except httpx.HTTPError:
            time.sleep(0.25)
    proc.kill()
    raise AssertionError(f"service did not answer:\n{output.read_text()}")


def exercise(url: str) -> list[int]:
    agent = {"Authorization": f"Bearer {AGENT}"}
    admin = {"Authorization": f"Bearer {ADMIN}"}
    codes = []
    with httpx.Client(base_url=url, timeout=30) as c:
        r = c.post(
            "/v1/memories",
            json={"memories": [{"id": "vault", "content": CONTENT, "entities": ["Zebra Quartz"]}]},
            headers=agent,
        )
        codes.append(r.status_code)
        codes.append(c.post("/v1/recall", json={"query": QUERY}, headers=agent).status_code)
        codes.append(c.post("/v1/recall", json={"query": QUERY, "tiers": ["nope"]}, headers=agent).status_code)
        codes.append(
            c.post("/v1/recall", json={"query": QUERY}, headers={"Authorization": f"Bearer {WRONG}"}).status_code
        )
        codes.append(
            c.post("/v1/memories", json={"memories": [{"content": CONTENT, "tier": "nope"}]}, headers=agent).status_code
        )
        codes.append(
            c.post(
                "/v1/memories", content=b'{"memories": [{"content": "' + CONTENT.encode() + b'"', headers=agent
            ).status_code
        )
        codes.append(
            c.post(
                "/v1/graph", json={"entities": [{"name": "Zebra Quartz", "summary": CONTENT}]}, headers=agent
            ).status_code
        )
        codes.append(c.post("/admin/config/reload", json={}, headers=admin).status_code)
        codes.append(c.post("/admin/reindex", json={"target": "typesense"}, headers=agent).status_code)
        codes.append(c.delete("/v1/memories/vault", headers=agent).status_code)
        codes.append(c.delete("/v1/memories/vault", headers=agent).status_code)
    time.sleep(1.0)  # let the outbox worker try (and, with Typesense away, warn)
    return codes


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


@pytest.mark.parametrize("typesense_up", [True, False], ids=["typesense-up", "typesense-away"])
def test_default_level_logs_hold_no_content_queries_or_keys(
    home: Path, postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, typesense_up: bool
) -> None:
    db = f"braid_logs_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {db}")
    dsn = postgres.dsn().replace("/postgres?", f"/{db}?")
    nodes = [typesense.url] if typesense_up else [f"http://127.0.0.1:{free_port()}"]
    proc, url, output = run_service(home, dsn, nodes, typesense.api_key, f"logs_{db}")
    try:
        codes = exercise(url)
    finally:
        stop(proc)
    text = output.read_text()
    assert codes == [201, 200, 400, 401, 400, 400, 201, 200, 403, 200, 404], codes
    assert "Braid listening" in text  # the log was captured at all
    if not typesense_up:
        assert "WARNING" in text  # the warning paths ran
    for secret in (
        CONTENT,
        "zebra-quartz",
        "4412",
        "vault code",
        QUERY,
        AGENT,
        ADMIN,
        WRONG,
        typesense.api_key,
        "Zebra Quartz",
    ):
        assert secret not in text, f"{secret!r} in the service log:\n{text}"
