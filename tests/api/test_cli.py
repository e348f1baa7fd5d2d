"""`python -m service` (what `make run` runs): starts the embedded stack and the
HTTP service, answers, and on Ctrl-C leaves no process behind; the next start
finds its data."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from config import DEFAULT_CONFIG_PATH
from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense, free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="braid-cli-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def start(home: Path, port: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BRAID_")}
    config = home / "braid.yaml"
    if not config.exists():
        config.write_text(DEFAULT_CONFIG_PATH.read_text())
    env.update(BRAID_HOME=str(home), BRAID_PORT=str(port), BRAID_CONFIG=str(config))
    # Output to a file (one per start), readable while the service runs.
    output = home / f"service-{time.monotonic_ns()}.out"
    with output.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    _outputs[proc.pid] = output
    return proc


_outputs: dict[int, Path] = {}


def read_output(proc: subprocess.Popen[bytes]) -> list[str]:
    """The lines the service has printed so far."""
    return _outputs[proc.pid].read_text().splitlines()


def wait_healthy(proc: subprocess.Popen[bytes], url: str, timeout: float = 120) -> dict:  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "\n".join(read_output(proc))
        try:
            r = httpx.get(f"{url}/health", timeout=2)
            if r.status_code == 200:
                return r.json()  # type: ignore[no-any-return]
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise AssertionError("service did not become healthy")


def descendants_and_servers(proc: subprocess.Popen[bytes], home: Path) -> list[psutil.Process]:
    """The service's children plus any server process using its data directory."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if str(home) in cmd:
            found.append(p)
    return found


def recall_items(url: str, auth: dict[str, str], timeout: float = 10) -> list[dict]:  # type: ignore[type-arg]
    """Recall until the answer changes to one item (a reload is asynchronous) or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.post(f"{url}/v1/recall", json={"query": "what does the user have"}, headers=auth)
        assert r.status_code == 200, r.text
        items = r.json()["items"]
        if len(items) == 1 or time.monotonic() > deadline:
            return items  # type: ignore[no-any-return]
        time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes]) -> str:
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    return "\n".join(read_output(proc))


def test_run_serves_then_ctrl_c_leaves_nothing(home: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start(home, port)
    try:
        body = wait_healthy(proc, url)
        assert {body["backends"][s]["status"] for s in ("typesense", "pgvector", "graph")} == {"up"}
        assert descendants_and_servers(proc, home), "expected Postgres and Typesense under the data dir"

        # The generated key is printed once; keys.json keeps its digest only.
        (line,) = [ln for ln in read_output(proc) if "generated agent key" in ln]
        agent_key = line.rsplit(": ", 1)[1]
        stored = json.loads((home / "keys.json").read_text())
        assert stored["agent"] == {"sha256": hashlib.sha256(agent_key.encode()).hexdigest()}
        assert agent_key not in (home / "keys.json").read_text()
        auth = {"Authorization": f"Bearer {agent_key}"}
        memories = [{"content": "User drives a Honda Civic"}, {"content": "User owns a red bicycle"}]
        r = httpx.post(f"{url}/v1/memories", json={"memories": memories}, headers=auth)
        assert r.status_code == 201, r.text
    finally:
        output = stop(proc)
    assert proc.returncode == 0, output
    assert "generated agent key" in output
    time.sleep(0.5)
    assert descendants_and_servers(proc, home) == []

    # The next start finds its data (and keeps its keys).
    proc = start(home, port)
    try:
        wait_healthy(proc, url)
        r = httpx.post(f"{url}/v1/recall", json={"query": "what car does this person have"}, headers=auth)
        assert r.status_code == 200, r.text
        assert r.json()["items"][0]["content"] == "User drives a Honda Civic"
        assert len(r.json()["items"]) == 2

        # SIGHUP reloads the config; a bad file keeps the running one.
        config = home / "braid.yaml"
        config.write_text(config.read_text().replace("searchTopK: 10", "searchTopK: 1"))
        proc.send_signal(signal.SIGHUP)
        assert len(recall_items(url, auth)) == 1
        config.write_text("searchTopK: [\n")
        proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert len(recall_items(url, auth)) == 1
    finally:
        output = stop(proc)
    assert "generated agent key" not in output
    time.sleep(0.5)
    assert descendants_and_servers(proc, home) == []


def test_external_backends_start_no_embedded_process(
    home: Path, postgres: EmbeddedPostgres, typesense: EmbeddedTypesense
) -> None:
    import uuid

    import psycopg

    db = f"braid_ext_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {db}")
    dsn = postgres.dsn().replace("/postgres?", f"/{db}?")
    (home / "braid.yaml").write_text(
        f"postgres:\n  dsn: '{dsn}'\n"
        f"typesense:\n  nodes: ['{typesense.url}']\n  apiKey: '{typesense.api_key}'\n"
        f"  collection: ext_{db}\n"
    )
    port = free_port()
    proc = start(home, port)
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}")
        assert not (home / "postgres").exists()
        assert not (home / "typesense").exists()
        children = psutil.Process(proc.pid).children(recursive=True)
        assert [c.name() for c in children if c.name() in ("postgres", "typesense-server")] == []
    finally:
        output = stop(proc)
    assert proc.returncode == 0, output
    assert "embedded Postgres" not in output and "embedded Typesense" not in output
