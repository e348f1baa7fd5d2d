"""The ``braid`` command line, run as a subprocess (``python -m braid``, what the
``braid`` console script runs) against a real Braid served over a loopback
socket: ``ingest`` (10,000 LoCoMo-style lines with a progress bar, Ctrl-C and
a resume without duplicates, an interrupt that lands after the service
committed a batch, bad lines by number), ``recall``, ``reindex`` (progress,
exit status of a failed job), ``keys`` (create, list, rotate, revoke, in
force through a reload), ``serve``, and errors as one line with exit 2."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import msgspec
import psycopg
import pytest

import braid
from braid.cli.ingest import line_id
from config import load_config
from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense, free_port
from service.auth import Keyring, Principal, digest

from .conftest import ADMIN_A, AGENT_A, make_app, patient
from .live import Live, live

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Run:
    code: int
    out: str
    err: str


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("BRAID_")}
    # A terminal's progress bar even though the output is a pipe.
    base.update(TTY_INTERACTIVE="1", TTY_COMPATIBLE="1", COLUMNS="160", NO_COLOR="1")
    base.update(extra)
    return base


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def plain(text: str) -> str:
    """Output without the terminal codes rich writes (styles, the live bar's redraws)."""
    return ANSI.sub("", text)


def cli(*args: str, timeout: float = 300, **extra: str) -> Run:
    p = subprocess.run(
        [sys.executable, "-m", "braid", *args],
        cwd=ROOT,
        env=env(**extra),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Run(p.returncode, plain(p.stdout), plain(p.stderr))


def start_cli(tmp: Path, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp / f"cli-{time.monotonic_ns()}.err"
    with log.open("wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "braid", *args], cwd=ROOT, env=env(), stdout=subprocess.DEVNULL, stderr=f
        )
    return proc, log


def wait_for(check: Any, timeout: float = 120, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what or check}")


@pytest.fixture
def served(postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any) -> Iterator[Live]:
    app, dsn, alias = make_app(postgres, typesense, embedder, patient(load_config()))
    with live(app, dsn, alias) as srv:
        yield srv


def memories_of(srv: Live, tenant: str = "tenant-a") -> int:
    with braid.Client(srv.url, ADMIN_A) as c:
        return c.stats(tenant=tenant).tenants[0].memories


# --- ingest -------------------------------------------------------------------

SPEAKERS = ("Caroline", "Melanie")
TOPICS = (
    "went hiking near the lake with the kids",
    "started a pottery class on Tuesdays",
    "is reading a book about the history of jazz",
    "adopted a small grey cat named Pixel",
    "painted a sunrise over the mountains",
    "volunteers at the LGBTQ support group",
    "plans a camping trip for the summer",
    "ran a 10k charity race in the rain",
)


def locomo_lines(n: int, vectors: bool, seed: int = 7) -> list[str]:
    """LoCoMo-style turns (speaker, text, date, session) as memory objects,
    one per line; with ``vectors`` each carries its own 384-d embedding so
    the service does not embed 10,000 turns on a shared 2-core machine."""
    rng = random.Random(seed)
    start = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    lines = []
    for i in range(n):
        session = i // 20 + 1
        speaker = SPEAKERS[i % 2]
        memory: dict[str, Any] = {
            "content": f"{speaker}: I {rng.choice(TOPICS)} ({i})",
            "speaker": speaker,
            "kind": "turn",
            "session_id": f"session_{session}",
            "created_at": (start + timedelta(days=session, minutes=i % 20)).isoformat(),
            "metadata": {"dia_id": f"D{session}:{i % 20 + 1}"},
        }
        if vectors:
            memory["embedding"] = [round(rng.uniform(-1, 1), 3) for _ in range(384)]
        lines.append(json.dumps(memory))
    return lines


def test_ingest_10000_lines_survives_ctrl_c_and_resumes_without_duplicates(served: Live, tmp_path: Path) -> None:
    lines = locomo_lines(10_000, vectors=True)
    bad = {17: "{not json", 500: '["an", "array"]', 4031: None, 7777: None}
    for number, text in bad.items():
        if text is not None:
            lines[number - 1] = text
    broken = json.loads(lines[4030])
    broken["importance"] = 2.0
    lines[4030] = json.dumps(broken)
    lines[7776] = json.dumps({**json.loads(lines[7776]), "content": "   "})
    file = tmp_path / "locomo.jsonl"
    file.write_text("\n".join(lines) + "\n")
    state = tmp_path / "locomo.jsonl.braid-ingest"
    args = ("ingest", str(file), "--batch", "200", "--url", served.url, "--key", AGENT_A)

    proc, log = start_cli(tmp_path, *args)
    try:
        # Interrupted once a few batches are in.
        wait_for(
            lambda: state.exists() and json.loads(state.read_text())["lines"] >= 2000, timeout=600, what="2000 lines in"
        )
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    first = plain(log.read_text())
    assert "Traceback" not in first
    assert "interrupted: " in first and "run the same command again to continue" in first
    stopped_at = json.loads(state.read_text())["lines"]
    assert 2000 <= stopped_at < 10_000

    second = cli(*args)
    assert second.code == 1, second.err  # 1: some lines were bad
    assert f"resuming {file} at line {stopped_at + 1} of 10000" in second.err
    assert "lines/s" in second.err and "10000/10000" in second.err  # the progress bar, with its rate
    everything = first + second.err
    assert "line 17: invalid JSON: " in everything
    assert "line 500: not a JSON object (a memory) but an array" in everything
    assert "line 4031: importance: Expected `float` <= 1.0" in everything
    assert "line 7777: content must not be empty" in everything
    assert "bad lines: 17, 500, 4031, 7777" in second.err
    cp = json.loads(state.read_text())
    assert (cp["lines"], cp["bad"], cp["bad_lines"]) == (10_000, 4, [17, 500, 4031, 7777])

    # Every good line once: no duplicate of the batch in flight at Ctrl-C.
    assert memories_of(served) == 10_000 - 4
    with braid.Client(served.url, AGENT_A) as c:
        turn = c.memory(line_id(1234, lines[1233].encode()))
        assert turn.content == json.loads(lines[1233])["content"] and turn.session_id == "session_62"

    # Done: a third run has nothing left to send.
    third = cli(*args)
    assert third.code == 1 and "0 memories written in this run (9996 in all)" in third.err
    assert memories_of(served) == 10_000 - 4


class HoldingProxy:
    """An HTTP proxy in front of the real service that, for the ``hold``-th
    memory write, forwards it (the service commits it) and then keeps the
    answer back until released: the client is interrupted after the commit,
    before it learns of it (a fault; everything else passes through)."""

    def __init__(self, upstream: str, hold: int) -> None:
        self.upstream, self.hold = upstream, hold
        self.writes = 0
        self.held = threading.Event()
        self.release = threading.Event()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                r = httpx.request(self.command, proxy.upstream + self.path, content=body, headers=headers, timeout=120)
                if self.command == "POST" and self.path == "/v1/memories":
                    proxy.writes += 1
                    if proxy.writes == proxy.hold:
                        proxy.held.set()
                        proxy.release.wait(120)
                        return
                self.send_response(r.status_code)
                for k, v in r.headers.items():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                        self.send_header(k, v)
                self.send_header("content-length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

            do_GET = do_POST = do_DELETE = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def test_an_interrupt_after_the_service_committed_a_batch_duplicates_nothing(served: Live, tmp_path: Path) -> None:
    lines = [json.dumps({"content": f"Turn {i} of a short chat", "speaker": "Sam"}) for i in range(1, 41)]
    lines[24] = json.dumps({"content": "Sam moved to Porto", "mem_key": "sam.city", "speaker": "Sam"})
    file = tmp_path / "chat.jsonl"
    file.write_text("\n".join(lines) + "\n")
    state = tmp_path / "chat.jsonl.braid-ingest"
    proxy = HoldingProxy(served.url, hold=3)
    try:
        args = ("ingest", str(file), "--batch", "10", "--url", proxy.url, "--key", AGENT_A)
        proc, log = start_cli(tmp_path, *args)
        try:
            assert proxy.held.wait(120), log.read_text()
            # Batch 3 (lines 21-30) is committed, the CLI has not heard back.
            assert memories_of(served) == 30
            assert json.loads(state.read_text())["lines"] == 20
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=60) == 130, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
        assert json.loads(state.read_text())["lines"] == 20
        proxy.release.set()

        again = cli(*args)
        assert again.code == 0, again.err
        assert f"resuming {file} at line 21 of 40" in again.err
        assert "20 memories written in this run (40 in all)" in again.err
    finally:
        proxy.close()
    assert memories_of(served) == 40  # lines 21-30 were sent twice and stored once
    with braid.Client(served.url, AGENT_A) as c:
        versions = c.versions("sam.city").memories
    # Sent twice, the mem_key's memory is still one current version, not one retiring the other.
    assert [(v.id, v.current) for v in versions] == [(line_id(25, lines[24].encode()), True)]


def test_ingest_checkpoint_guards(served: Live, tmp_path: Path) -> None:
    file = tmp_path / "few.jsonl"
    file.write_text('{"content": "first line"}\n{"content": "second line"}\n')
    args = ("ingest", str(file), "--url", served.url, "--key", AGENT_A)
    assert cli(*args).code == 0
    # Appended lines are picked up by the next run.
    with file.open("a") as f:
        f.write('{"content": "third line"}\n')
    grown = cli(*args)
    assert grown.code == 0 and "resuming" in grown.err and "1 memories written in this run (3 in all)" in grown.err

    # The done part changed: refused, with the way out.
    file.write_text('{"content": "FIRST line"}\n{"content": "second line"}\n{"content": "third line"}\n')
    changed = cli(*args)
    assert changed.code == 2
    assert changed.err.strip().splitlines()[-1] == (
        f"braid: error: {file} changed in its first 3 lines since the checkpoint {file}.braid-ingest was "
        "written; pass --restart to ingest it from line 1 (lines already in are rewritten, not duplicated)"
    )
    # Another key (tenant) than the checkpoint's: refused too.
    other = cli("ingest", str(file), "--url", served.url, "--key", ADMIN_A)
    assert other.code == 2 and "is of a run to another service or key" in other.err
    restarted = cli(*args, "--restart")
    assert restarted.code == 0, restarted.err
    assert memories_of(served) == 4  # line 1 rewritten with new bytes: a new id; lines 2-3 replaced in place

    missing = cli("ingest", str(tmp_path / "nope.jsonl"), "--url", served.url, "--key", AGENT_A)
    assert missing.code == 2 and "does not exist" in missing.err


def test_ingest_reports_every_kind_of_bad_line_by_number(served: Live, tmp_path: Path) -> None:
    file = tmp_path / "mixed.jsonl"
    file.write_text(
        "\n".join(
            [
                '{"content": "good one", "id": "g1"}',
                "",
                '{"content": "bad tier", "tier": "nope"}',
                "42",
                '{"content": "good two", "id": "g2"}',
                '{"content": "unknown field", "colour": "red"}',
                '{"content": "good three", "id": "g1"}',
                '{"text": "no content"}',
            ]
        )
    )
    run = cli("ingest", str(file), "--url", served.url, "--key", AGENT_A)
    assert run.code == 1
    assert "line 3: tier: unknown tier 'nope'; memory tiers are ['session', 'rag']" in run.err
    assert "line 4: not a JSON object (a memory) but a number" in run.err
    assert "line 6: Object contains unknown field `colour`" in run.err
    assert "line 8: Object contains unknown field `text`" in run.err
    assert "bad lines: 3, 4, 6, 8" in run.err
    with braid.Client(served.url, AGENT_A) as c:
        # A later line with the same id replaces the earlier one, as on the API.
        assert c.memory("g1").content == "good three"
        assert c.memory("g2").content == "good two"
    assert memories_of(served) == 2


def test_ingest_splits_batches_the_service_finds_too_big(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any, tmp_path: Path
) -> None:
    """Over limits.maxBatch (a 400 naming no line) or server.maxBodyBytes (413),
    a batch is halved until it fits; a line alone over the body limit is bad."""
    cfg = patient(load_config())
    cfg = msgspec.structs.replace(
        cfg,
        limits=msgspec.structs.replace(cfg.limits, max_batch=4),
        server=msgspec.structs.replace(cfg.server, max_body_bytes=2048),
    )
    app, dsn, alias = make_app(postgres, typesense, embedder, cfg)
    lines = [json.dumps({"content": f"Line {i}: " + "words " * 40}) for i in range(1, 13)]
    lines[6] = json.dumps({"content": "too long " * 400})  # line 7: ~3.6 kB alone
    file = tmp_path / "big.jsonl"
    file.write_text("\n".join(lines) + "\n")
    with live(app, dsn, alias) as srv:
        run = cli("ingest", str(file), "--batch", "12", "--url", srv.url, "--key", AGENT_A)
        assert run.code == 1, run.err
        assert "line 7: larger than the service accepts: " in run.err
        assert "bad lines: 7" in run.err
        assert memories_of(srv) == 11


# --- recall, reindex, errors --------------------------------------------------


def test_recall_prints_the_block_and_the_per_source_table(served: Live) -> None:
    with braid.Client(served.url, AGENT_A) as c:
        c.remember([{"content": "Alex drives a blue Subaru", "speaker": "Alex"}, "Alex keeps bees in the garden"])
    run = cli("recall", "what car does Alex drive", "--top-k", "2", "--url", served.url, "--key", AGENT_A)
    assert run.code == 0, run.err
    assert run.out.startswith("[Memory: note | ")
    assert "Alex drives a blue Subaru" in run.out and "rank" not in run.out  # the block alone on stdout
    header = next(line for line in run.err.splitlines() if "typesense" in line and "rrf" in line)
    for column in ("pgvector", "graph", "factors", "score", "content"):
        assert column in header
    assert "speaker ×1.5" in run.err  # the query names Alex, the memory's speaker
    assert "strategy auto, embedding ok" in run.err

    as_json = cli("recall", "what car does Alex drive", "--json", "--url", served.url, "--key", AGENT_A)
    body = json.loads(as_json.out)
    assert body["items"][0]["content"] == "Alex drives a blue Subaru"
    assert set(body["sources"]) == {"typesense", "pgvector", "graph"}


def test_recall_shows_the_search_within_the_named_dates_after_the_sources(served: Live) -> None:
    with braid.Client(served.url, AGENT_A) as c:
        c.remember([{"content": "We picked the blue logo for the launch", "created_at": "2024-03-05T10:00:00Z"}])
    run = cli("recall", "What did we settle on 5 March 2024?", "--url", served.url, "--key", AGENT_A)
    assert run.code == 0, run.err
    assert "We picked the blue logo for the launch" in run.out
    header = next(line for line in run.err.splitlines() if "typesense" in line and "rrf" in line)
    assert header.index("graph") < header.index("dates") < header.index("rrf")


def test_health_shows_each_backend(served: Live) -> None:
    run = cli("health", "--url", served.url)
    assert run.code == 0, run.err
    assert f"Braid at {served.url}: ok" in run.out
    for backend in ("typesense", "pgvector", "graph", "sync"):
        cells = ([c.strip() for c in line.split("│") if c.strip()] for line in run.out.splitlines())
        assert [backend, "up"] in (row[:2] for row in cells), run.out
    # The graph's cache counters as key=value pairs, not a Python dict.
    assert "tenants=0" in run.out and "{'tenants'" not in run.out, run.out


def test_errors_are_one_line_and_exit_2(served: Live) -> None:
    wrong = cli("recall", "x", "--url", served.url, "--key", "wrong-key-0123456789")
    assert wrong.code == 2
    assert wrong.err.strip() == (
        "braid: error: invalid API key (--key / BRAID_API_KEY, or --admin-key / BRAID_ADMIN_KEY for admin commands)"
    )
    bad = cli("recall", "x", "--top-k", "0", "--url", served.url, "--key", AGENT_A)
    assert bad.code == 2 and bad.err.strip().startswith("braid: error: top_k") and "(400 on POST /v1/recall)" in bad.err
    nokey = cli("recall", "x", "--url", served.url)
    assert nokey.code == 2 and nokey.err.strip() == (
        "braid: error: no API key: pass --key (or --admin-key) or set BRAID_API_KEY (BRAID_ADMIN_KEY for admin commands)"
    )
    port = free_port()
    down = cli("recall", "x", "--url", f"http://127.0.0.1:{port}", "--key", AGENT_A)
    assert down.code == 2 and "Traceback" not in down.err
    assert down.err.strip().splitlines()[-1].startswith(f"braid: error: cannot reach Braid at http://127.0.0.1:{port}")


def test_reindex_follows_progress_and_fails_with_a_failed_job(served: Live) -> None:
    with braid.Client(served.url, AGENT_A) as c:
        c.remember([f"Reindex me {i}" for i in range(5)])
    run = cli("reindex", "typesense", "--poll", "0.05", "--url", served.url, "--admin-key", ADMIN_A)
    assert run.code == 0, run.err
    job_id = run.out.strip()
    assert f"reindex job {job_id} started (typesense)" in run.err
    assert f"job {job_id}: done" in run.err
    assert "typesense switched" in run.err or "typesense copying" in run.err
    assert f"reindex job {job_id} done in " in run.err

    agent = cli("reindex", "--url", served.url, "--admin-key", AGENT_A)
    assert agent.code == 2
    assert agent.err.strip() == "braid: error: this endpoint needs an admin key (--admin-key / BRAID_ADMIN_KEY)"
    unknown = cli("reindex", "everything", "--url", served.url, "--admin-key", ADMIN_A)
    assert unknown.code == 2 and "target" in unknown.err and "(400 on POST /admin/reindex)" in unknown.err
    # --tenant reaches the service (only an import job takes one).
    misplaced = cli("reindex", "typesense", "--tenant", "tenant-a", "--url", served.url, "--admin-key", ADMIN_A)
    assert misplaced.code == 2 and "tenant applies to target import only, not typesense" in misplaced.err

    # A job that failed (recorded as the service records one): followed, exit 1.
    with psycopg.connect(served.dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO reindex_jobs (id, target, status, progress, error, finished_at)"
            ' VALUES (\'failed-job\', \'typesense\', \'failed\', \'{"typesense": {"phase": "copying", "done": 3, "total": 9}}\','
            " 'typesense unreachable', clock_timestamp())"
        )
    failed = cli("reindex", "--job", "failed-job", "--url", served.url, "--admin-key", ADMIN_A)
    assert failed.code == 1
    assert "reindex job failed-job failed: typesense unreachable" in failed.err
    assert "3/9" in failed.err


# --- keys ---------------------------------------------------------------------


@pytest.fixture
def keyed(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, embedder: Any, tmp_path: Path
) -> Iterator[tuple[Live, Path]]:
    """A served Braid whose keys follow its config file (and the test admin key)."""
    path = tmp_path / "braid.yaml"
    path.write_text("searchTopK: 10\n")
    app, dsn, alias = make_app(postgres, typesense, embedder, patient(load_config(path)), str(path))
    path.write_text(
        "# Our deployment's config: this comment must survive key edits.\n"
        f"typesense:\n  collection: {alias}  # the test's alias\n"
        "searchTopK: 10\n"
        "auth:\n  defaultTenant: default\n  keys: []\n"
    )
    with live(app, dsn, alias) as srv:
        fixed = {digest(ADMIN_A): Principal(tenant="tenant-a", role="admin")}
        app.state.keyring = Keyring.from_config(app.state.runtime.engine.config, fixed)
        yield srv, path


def status(url: str, key: str) -> int:
    return httpx.post(
        f"{url}/v1/recall", json={"query": "anything"}, headers={"Authorization": f"Bearer {key}"}
    ).status_code


def test_keys_create_list_rotate_revoke_through_reloads(keyed: tuple[Live, Path], tmp_path: Path) -> None:
    srv, path = keyed
    conn = ("--config", str(path), "--url", srv.url, "--admin-key", ADMIN_A)
    created = cli("keys", "create", "--tenant", "cli-tenant", "--reload", *conn)
    assert created.code == 0, created.err
    key = created.out.strip()
    assert key.startswith("braid_agent_") and len(created.out.splitlines()) == 1
    assert f"reloaded {path}: the change is in force" in created.err
    assert status(srv.url, key) == 200
    text = path.read_text()
    assert key not in text and digest(key) in text
    assert "# Our deployment's config: this comment must survive key edits." in text
    assert "collection: " in text and "# the test's alias" in text
    assert f"    - {{tenant: cli-tenant, role: agent, sha256: {digest(key)}}}" in text

    home = tmp_path / "home"
    listed = cli("keys", "list", "--config", str(path), "--home", str(home))
    assert listed.code == 0 and digest(key) in listed.out and key not in listed.out
    assert "cli-tenant" in listed.out

    rotated = cli("keys", "rotate", digest(key)[:12], "--reload", *conn)
    assert rotated.code == 0, rotated.err
    new = rotated.out.strip()
    assert new != key and (status(srv.url, key), status(srv.url, new)) == (200, 200)
    assert f"braid keys revoke {digest(key)[:16]}" in rotated.err

    revoked = cli("keys", "revoke", digest(key)[:12], "--reload", *conn)
    assert revoked.code == 0, revoked.err
    assert (status(srv.url, key), status(srv.url, new)) == (401, 200)
    with braid.Client(srv.url, new) as c:  # the new key acts on the same tenant
        c.remember("Written with the rotated key")

    # Not edited without a config file of one's own; unknown and ambiguous prefixes.
    nofile = cli("keys", "create", "--tenant", "t")
    assert nofile.code == 2 and nofile.err.startswith("braid: error: no config file to write the key to: pass --config")
    unknown = cli("keys", "rotate", "deadbeef00", "--config", str(path), "--home", str(home))
    assert unknown.code == 2 and "no key whose digest starts with deadbeef00" in unknown.err
    short = cli("keys", "revoke", "abc", "--config", str(path))
    assert short.code == 2 and "is not a digest prefix" in short.err
    invalid = cli("keys", "create", "--tenant", "bad tenant!", "--config", str(path))
    assert invalid.code == 2 and "not written, the result would not be a valid config" in invalid.err
    assert "bad tenant" not in path.read_text()


def test_keys_rotate_an_embedded_default_key(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    old_agent, admin = "braid_agent_old-0123456789abcdef", "braid_admin_0123456789abcdef"
    (home / "keys.json").write_text(
        json.dumps({"agent": {"sha256": digest(old_agent)}, "admin": {"sha256": digest(admin)}})
    )
    listed = cli("keys", "list", "--home", str(home))
    assert digest(old_agent) in listed.out and "keys.json" in listed.out
    rotated = cli("keys", "rotate", digest(old_agent)[:10], "--home", str(home))
    assert rotated.code == 0, rotated.err
    new = rotated.out.strip()
    stored = json.loads((home / "keys.json").read_text())
    assert stored == {"agent": {"sha256": digest(new)}, "admin": {"sha256": digest(admin)}}
    assert oct((home / "keys.json").stat().st_mode & 0o777) == "0o600"
    assert "restart it for the new key" in rotated.err
    revoke = cli("keys", "revoke", digest(admin)[:10], "--home", str(home), "--config", str(tmp_path / "c.yaml"))
    assert revoke.code == 2


# --- serve --------------------------------------------------------------------


def test_serve_runs_the_service_and_stops_on_ctrl_c(
    postgres: EmbeddedPostgres, typesense: EmbeddedTypesense, tmp_path: Path
) -> None:
    from .conftest import fresh_database

    dsn = fresh_database(postgres)
    config = tmp_path / "braid.yaml"
    config.write_text(
        f"postgres:\n  dsn: '{dsn}'\n"
        f"typesense:\n  nodes: ['{typesense.url}']\n  apiKey: '{typesense.api_key}'\n"
        f"  collection: serve_{hashlib.sha1(dsn.encode()).hexdigest()[:8]}\n"
    )
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as f:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "braid",
                "serve",
                "--port",
                str(port),
                "--home",
                str(tmp_path),
                "--config",
                str(config),
            ],
            cwd=ROOT,
            env=env(),
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    try:

        def up() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, timeout=180, what="braid serve to answer")
        (line,) = [ln for ln in log.read_text().splitlines() if "generated agent key" in ln]
        key = line.rsplit(": ", 1)[1]
        with braid.Client(f"http://127.0.0.1:{port}", key) as c:
            assert c.remember("Served by braid serve").ids
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
    assert code == 0, log.read_text()
