"""``python -m service``: start the stack (embedded or external) and serve HTTP.

Environment: ``BRAID_HOME`` (data directory, default ``./.braid``),
``BRAID_PORT`` (default from config, 8080), ``BRAID_CONFIG`` (YAML file),
``BRAID_API_KEY`` / ``BRAID_ADMIN_KEY`` (embedded default keys).

Ctrl-C or SIGTERM stops the HTTP server, then Typesense, then Postgres, and
leaves no process behind. SIGHUP reloads the config.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

import uvloop
from threadpoolctl import threadpool_limits

from config import ConfigError, ConfigHolder, config_path, load_config
from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense
from deploy.supervisor import Supervisor
from indexers.runtime import Backends

from .app import AppSettings, create_app
from .auth import Keyring, Principal, default_keys

log = logging.getLogger("braid")


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
        if not cfg.auth.keys or os.environ.get("BRAID_API_KEY") or os.environ.get("BRAID_ADMIN_KEY"):
            extra, messages = default_keys(home, cfg.auth.default_tenant)
            for line in messages:
                print(f"braid: {line}", flush=True)
            if not messages:
                log.info("API keys: from the environment or %s", home / "keys.json")
        config = ConfigHolder(cfg, str(config_path()))
        settings = AppSettings(
            config=config,
            backends=Backends(
                postgres_dsn=dsn,
                typesense_nodes=nodes,
                typesense_api_key=ts_key,
                postgres_replica_dsn=cfg.postgres.replica_dsn,
                typesense_clusters=tuple(
                    (tuple(c.nodes), c.api_key or cfg.typesense.api_key or os.environ.get("TYPESENSE_API_KEY", ""))
                    for c in cfg.typesense.clusters
                ),
            ),
            keyring=Keyring.from_config(config, extra),
            settle_heap=True,
        )
        # uvloop: asyncio's loop in C (measured with the other service-side changes in
        # benchmarks/results/load-tuning.md, not alone).
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_serve(settings, cfg.server.host, port))
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


async def _serve(settings: AppSettings, host: str, port: int) -> None:
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
    log.info("Braid listening on http://%s:%d", host, port)
    await server.serve()


if __name__ == "__main__":
    sys.exit(main())
