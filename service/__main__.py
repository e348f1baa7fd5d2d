"""``python -m service``: start the stack (embedded or external) and serve HTTP.

Environment: ``BRAID_HOME`` (data directory, default ``./.braid``),
``BRAID_PORT`` (default from config, 8080), ``BRAID_CONFIG`` (YAML file),
``BRAID_API_KEY`` / ``BRAID_ADMIN_KEY`` (embedded default keys).

Ctrl-C or SIGTERM stops the HTTP server, then Typesense, then Postgres, and
leaves no process behind. SIGHUP reloads the config.

With ``server.workers`` above 1 this process serves nothing itself: it
starts the stack, then that many children (``python -m service`` again,
told the stack's addresses in :data:`WORKER_ENV` and :data:`BACKENDS_ENV`),
each serving the port with its own pools, caches and background workers; the
kernel spreads connections among them (granian binds with ``SO_REUSEPORT``).
It passes SIGHUP on to every child, and a child whose admin route reloaded
the config asks it to (:func:`reload_siblings`). The first child starts
alone, and the others once it serves (it migrates the database and creates
what is missing); if it exits before it serves, everything stops and the
exit status is 1. A child that dies is started again, unless it died within
:data:`CRASH_S` of its start :data:`CRASHES` times in a row (then everything
stops, status 1); Ctrl-C or SIGTERM stops the children, then the stack. A
child whose parent is gone (killed) stops by itself.
With metrics on, the children keep their counts in one directory
(``PROMETHEUS_MULTIPROC_DIR``, made here and removed at the end), which every
child's ``/metrics`` sums (:mod:`service.metrics`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import msgspec
import uvloop
from threadpoolctl import threadpool_limits

from config import BraidConfig, ConfigError, ConfigHolder, config_path, load_config
from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense
from deploy.supervisor import Supervisor
from indexers.runtime import Backends

from .app import AppSettings, create_app
from .auth import Keyring, Principal, default_keys

log = logging.getLogger("braid")

#: Set in a child of a service with ``server.workers`` above 1: the child's
#: number (1-based). Such a process serves on the stack in :data:`BACKENDS_ENV`.
WORKER_ENV = "BRAID_WORKER"
#: The stack a child serves on: :class:`indexers.runtime.Backends` as JSON.
BACKENDS_ENV = "BRAID_WORKER_BACKENDS"
#: The parent's pid, as the child was started: a child that finds another
#: parent (its own was killed, even before it began serving) stops.
PARENT_ENV = "BRAID_WORKER_PARENT"
#: A child that died this soon after its start, :data:`CRASHES` times in a
#: row, is not started again: the service stops (a bad config or a port
#: taken would only die again).
CRASH_S = 10.0
CRASHES = 3
#: How long stopping children may take before they are killed.
STOP_S = 30.0
#: How often a child checks that its parent is still there (seconds).
ORPHAN_CHECK_S = 1.0


def one_blas_thread() -> None:
    """numpy's BLAS (OpenBLAS) on one thread for the rest of the process.

    The recalls share the event loop and two cores, and a BLAS pool's
    threads spin after each product: the products of recalls (the seeds'
    one in :meth:`indexers.graph_cache.TenantGraph.seeds` among them) run
    on the calling thread only (docs/design.md, the seeds)."""
    threadpool_limits(limits=1, user_api="blas")


def main() -> int:
    logging.basicConfig(
        level=os.environ.get("BRAID_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    one_blas_thread()
    try:
        cfg = load_config()
    except ConfigError as exc:
        print(f"braid: {exc}", file=sys.stderr)
        return 2
    home = Path(os.environ.get("BRAID_HOME", ".braid")).resolve()
    home.mkdir(parents=True, exist_ok=True)
    port = int(os.environ.get("BRAID_PORT", cfg.server.port))
    given = os.environ.get(BACKENDS_ENV)
    if os.environ.get(WORKER_ENV) and given:
        # A child of a service with server.workers > 1: the stack is its parent's.
        backends = msgspec.json.decode(given, type=Backends)
        # The keys the parent made (keys.json) or the environment names: nothing to print.
        given_keys = default_keys(home, cfg.auth.default_tenant)[0] if _default_keys_wanted(cfg) else {}
        _serve_on(cfg, backends, given_keys, port, parent=int(os.environ.get(PARENT_ENV, os.getppid())))
        return 0

    postgres = typesense = supervisor = None
    try:
        if cfg.postgres.dsn is None:
            postgres = EmbeddedPostgres(home / "postgres")
            dsn = postgres.start()
            log.info("embedded Postgres up at %s", dsn)
        else:
            dsn = cfg.postgres.dsn
        if not cfg.typesense.nodes:
            typesense = EmbeddedTypesense(home / "typesense")
            nodes: tuple[str, ...] = (typesense.start(),)
            ts_key = typesense.api_key
            log.info("embedded Typesense up at %s", nodes[0])
            # Restarted if it crashes (same data dir and port); the outbox catches it up.
            supervisor = Supervisor(typesense).start()
        else:
            nodes = tuple(cfg.typesense.nodes)
            ts_key = cfg.typesense.api_key or os.environ.get("TYPESENSE_API_KEY", "")

        extra: dict[str, Principal] = {}
        if _default_keys_wanted(cfg):
            extra, messages = default_keys(home, cfg.auth.default_tenant)
            for line in messages:
                print(f"braid: {line}", flush=True)
            if not messages:
                log.info("API keys: from the environment or %s", home / "keys.json")
        backends = Backends(
            postgres_dsn=dsn,
            typesense_nodes=nodes,
            typesense_api_key=ts_key,
            postgres_replica_dsn=cfg.postgres.replica_dsn,
            typesense_clusters=tuple(
                (tuple(c.nodes), c.api_key or cfg.typesense.api_key or os.environ.get("TYPESENSE_API_KEY", ""))
                for c in cfg.typesense.clusters
            ),
        )
        if cfg.server.workers > 1:
            return Workers(
                cfg.server.workers, backends, metrics=cfg.metrics.enabled, home=home, host=cfg.server.host, port=port
            ).run()
        _serve_on(cfg, backends, extra, port)
    finally:
        if supervisor is not None:
            supervisor.stop()
        if typesense is not None:
            typesense.stop()
            log.info("embedded Typesense stopped")
        if postgres is not None:
            postgres.stop()
            log.info("embedded Postgres stopped")
    return 0


def _serve_on(
    cfg: BraidConfig, backends: Backends, keys: dict[str, Principal], port: int, *, parent: int | None = None
) -> None:
    """Serve the app on ``backends`` until stopped (:func:`_serve`): one
    service process, or a child of several (``parent``: its parent's pid;
    after a successful ``POST /admin/config/reload`` the child sends the
    parent SIGHUP, which the parent passes to every child)."""
    config = ConfigHolder(cfg, str(config_path()))
    settings = AppSettings(
        config=config,
        backends=backends,
        keyring=Keyring.from_config(config, keys),
        settle_heap=True,
        on_reload=reload_siblings if parent is not None else None,
    )
    # uvloop: asyncio's loop in C (measured with the other service-side changes in
    # benchmarks/results/load-tuning.md, not alone).
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_serve(settings, cfg.server.host, port, parent=parent))


def _default_keys_wanted(cfg: BraidConfig) -> bool:
    """Whether the embedded default keys serve (no keys configured, or one given in the environment)."""
    return not cfg.auth.keys or bool(os.environ.get("BRAID_API_KEY") or os.environ.get("BRAID_ADMIN_KEY"))


def reload_siblings() -> None:
    """In a child of a service with ``server.workers`` above 1, after its admin
    route reloaded the config: ask the parent to pass SIGHUP on to every
    child (this one reloads again, to the same config)."""
    if os.environ.get(WORKER_ENV):
        os.kill(os.getppid(), signal.SIGHUP)


class Workers:
    """``server.workers`` children serving the port, kept running (see the module's docstring)."""

    def __init__(self, count: int, backends: Backends, *, metrics: bool, home: Path, host: str, port: int) -> None:
        self.count = count
        #: Where the first child is asked for /health before the others start.
        self.health = f"http://{_loopback(host)}:{port}/health"
        self.env = {**os.environ, BACKENDS_ENV: msgspec.json.encode(backends).decode(), PARENT_ENV: str(os.getpid())}
        self.metrics_dir: Path | None = None
        if metrics:
            self.metrics_dir = Path(tempfile.mkdtemp(prefix="metrics-", dir=home))
            self.env["PROMETHEUS_MULTIPROC_DIR"] = str(self.metrics_dir)
        self.children: dict[int, tuple[subprocess.Popen[bytes], float]] = {}
        self._stop = threading.Event()
        #: Each child's exits in a row within CRASH_S of its start.
        self._quick: dict[int, int] = {}
        self._hup = threading.Event()

    def run(self) -> int:
        """Serve until Ctrl-C or SIGTERM (0), or until a child dies at start (1)."""
        previous = {sig: signal.signal(sig, self._signalled) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            # The first child alone until it serves: it migrates and creates what
            # is missing (indexes, collections) before the others look.
            self._start(1)
            if not self._serving(self.children[1][0]):
                log.error("service process 1 exited (%s) at start: stopping", self.children[1][0].returncode)
                return 1
            for n in range(2, self.count + 1):
                self._start(n)
            log.info("%d service processes serving", self.count)
            while not self._stop.is_set():
                self._stop.wait(0.2)
                if self._hup.is_set():
                    self._hup.clear()
                    for proc, _ in self.children.values():
                        if proc.poll() is None:
                            proc.send_signal(signal.SIGHUP)
                for n, (proc, started) in list(self.children.items()):
                    if proc.poll() is None or self._stop.is_set():
                        continue
                    self._dead(proc.pid)
                    quick = self._quick[n] = self._quick.get(n, 0) + 1 if time.monotonic() - started < CRASH_S else 0
                    if quick >= CRASHES:
                        log.error(
                            "service process %d exited (%s) %d times in a row at start: stopping",
                            n,
                            proc.returncode,
                            quick,
                        )
                        return 1
                    log.warning("service process %d exited (%s): starting it again", n, proc.returncode)
                    self._start(n)
            return 0
        finally:
            self._stop_children()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self.metrics_dir is not None:
                shutil.rmtree(self.metrics_dir, ignore_errors=True)

    def _serving(self, proc: subprocess.Popen[bytes]) -> bool:
        """Wait until ``proc`` answers /health (any status); False if it exited
        first. Ctrl-C or SIGTERM meanwhile: True (the caller stops)."""
        while not self._stop.is_set():
            if proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(self.health, timeout=1.0):
                    return True
            except urllib.error.HTTPError:
                return True  # it answered (503: a backend is down, but it serves)
            except OSError:
                self._stop.wait(0.2)
        return True

    def _signalled(self, signum: int, frame: object) -> None:
        (self._hup if signum == signal.SIGHUP else self._stop).set()

    def _start(self, n: int) -> None:
        env = {**self.env, WORKER_ENV: str(n)}
        proc = subprocess.Popen([sys.executable, "-m", "service"], env=env)
        self.children[n] = (proc, time.monotonic())

    def _dead(self, pid: int) -> None:
        """Forget a dead child's live gauges (its counts stay in the sums)."""
        if self.metrics_dir is not None:
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(pid, str(self.metrics_dir))  # type: ignore[no-untyped-call]

    def _stop_children(self) -> None:
        """SIGTERM to every child, then wait (killed after :data:`STOP_S`)."""
        for proc, _ in self.children.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_S
        for proc, _ in self.children.values():
            try:
                proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                log.warning("service process %d did not stop in %.0f s: killed", proc.pid, STOP_S)
                proc.kill()
                proc.wait()
        self.children.clear()


def _loopback(host: str) -> str:
    """An address of this machine that ``host`` (what the server binds) accepts connections on."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


async def _serve(settings: AppSettings, host: str, port: int, *, parent: int | None = None) -> None:
    """Serve ``settings``' app until SIGINT or SIGTERM (SIGHUP reloads the
    config); a child of a multi-process service (``parent``: its parent's
    pid) also stops once that parent is gone, as when it was killed."""
    from granian.constants import Interfaces
    from granian.server.embed import Server

    app = create_app(settings)
    server = Server(app, address=host, port=port, interface=Interfaces.ASGI, log_access=False)
    loop = asyncio.get_running_loop()

    async def reload_now() -> None:
        rt = getattr(app.state, "runtime", None)
        if rt is None:
            return
        try:
            await rt.engine.reload_config()
        except ConfigError as exc:
            log.error("config not reloaded, keeping the running config: %s", exc)

    def reload() -> None:
        task = loop.create_task(reload_now())
        pending.add(task)
        task.add_done_callback(pending.discard)

    pending: set[asyncio.Task[None]] = set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, server.stop)
    loop.add_signal_handler(signal.SIGHUP, reload)
    if parent is not None:

        async def orphaned() -> None:
            while os.getppid() == parent:
                await asyncio.sleep(ORPHAN_CHECK_S)
            log.error("the parent service process is gone: stopping")
            server.stop()  # type: ignore[no-untyped-call]
            # A start-up still waiting (on a stack that went with the parent)
            # would hold the stop off: past STOP_S the process ends anyway.
            await asyncio.sleep(STOP_S)
            log.error("still not stopped after %.0f s: exiting", STOP_S)
            os._exit(1)

        pending.add(loop.create_task(orphaned()))
    log.info("Braid listening on http://%s:%d", host, port)
    await server.serve()


if __name__ == "__main__":
    sys.exit(main())
