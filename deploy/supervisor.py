"""Keeping an embedded server up: restart it on the same data dir when it exits."""

from __future__ import annotations

import logging
import threading

from .embedded import EmbeddedTypesense

__all__ = ["Supervisor"]

log = logging.getLogger("braid.stack")


class Supervisor:
    """Restarts an embedded server that exits on its own (``make run``).

    Started again on the same data dir, Typesense replays its log and comes
    back, and the outbox fills in what it missed (why it may exit: the
    Typesense section of ``docs/design.md``).
    A daemon thread checks every ``interval`` seconds; repeated failures back
    off up to ``max_backoff``. It must outlive the server it restarts: the
    server's parent-death signal is tied to the thread that started it.
    """

    def __init__(
        self,
        server: EmbeddedTypesense,
        name: str = "Typesense",
        *,
        interval: float = 0.5,
        max_backoff: float = 30.0,
    ) -> None:
        self.server = server
        self.name = name
        self.interval = interval
        self.max_backoff = max_backoff
        self.restarts = 0
        #: One line per exit seen: the exit code and the log's last error line.
        self.exits: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"supervise-{name}", daemon=True)

    def start(self) -> Supervisor:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching (before the server is stopped on purpose)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _last_error(self) -> str:
        """The last error-level line of the server's log, if it has one."""
        logs = sorted((self.server.data_dir / "log").glob("*.log*"))
        lines = logs[-1].read_text(errors="replace").splitlines() if logs else []
        errors = [ln for ln in lines if ln.startswith("E") and "backward.hpp" not in ln]
        frames = [ln.split("] ", 1)[-1].strip() for ln in lines if "backward.hpp" in ln and "#0" in ln]
        return "; ".join(([errors[-1].split("] ", 1)[-1]] if errors else []) + frames[-1:]) or "no error line"

    def _run(self) -> None:
        backoff = 1.0
        while not self._stop.wait(self.interval):
            proc = self.server.proc
            if proc is None or proc.poll() is None:
                continue
            log.warning(
                "embedded %s exited with code %s (see %s); restarting it",
                self.name,
                proc.returncode,
                self.server.data_dir / "log",
            )
            self.exits.append(f"exit {proc.returncode}: {self._last_error()}")
            try:
                self.server.spawn()
                self.server.wait_ready(timeout=120)
            except (OSError, RuntimeError) as exc:
                log.error("embedded %s did not come back: %s; retrying in %.0f s", self.name, exc, backoff)
                if self._stop.wait(backoff):
                    return
                backoff = min(backoff * 2, self.max_backoff)
                continue
            self.restarts += 1
            backoff = 1.0
            log.warning("embedded %s is back (restart %d)", self.name, self.restarts)
