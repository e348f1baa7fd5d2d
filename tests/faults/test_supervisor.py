"""`make run`'s embedded Typesense is restarted when it dies on its own (the
soak saw 0.24.1 abort inside hnswlib), on the same data dir and port, with
its collections; a deliberate stop is not undone."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from benchmarks.faults.ledger import Ledger, Scenario
from deploy.embedded import EmbeddedTypesense
from deploy.supervisor import Supervisor

pytestmark = pytest.mark.faults


@pytest.fixture
def ts() -> Iterator[EmbeddedTypesense]:
    home = Path(tempfile.mkdtemp(prefix="braid-supervise-"))
    server = EmbeddedTypesense(home)
    server.start()
    yield server
    server.stop()
    shutil.rmtree(home, ignore_errors=True)


def test_a_crashed_typesense_is_restarted_with_its_data(ts: EmbeddedTypesense, ledger: Ledger) -> None:
    headers = {"X-TYPESENSE-API-KEY": ts.api_key}
    schema = {"name": "kept", "fields": [{"name": "t", "type": "string"}]}
    assert httpx.post(f"{ts.url}/collections", json=schema, headers=headers).status_code == 201
    r = httpx.post(f"{ts.url}/collections/kept/documents", json={"id": "1", "t": "still here"}, headers=headers)
    assert r.status_code == 201
    supervisor = Supervisor(ts, interval=0.2).start()
    try:
        first = ts.proc
        assert first is not None
        killed_at = time.monotonic()
        ts.kill()  # as a crash would
        deadline = killed_at + 90
        while supervisor.restarts < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        back_s = time.monotonic() - killed_at
        doc = httpx.get(f"{ts.url}/collections/kept/documents/1", headers=headers, timeout=5)
        ledger.record(
            Scenario(
                name="embedded Typesense crashed (SIGKILL), supervisor restarts it",
                injected=1,
                requests=1,
                recovery_s=round(back_s, 1),
                outcome=f"restarted {supervisor.restarts}x on the same port in {back_s:.1f} s; "
                f"document read back: {doc.status_code}",
            )
        )
        assert supervisor.restarts == 1
        assert ts.proc is not first and ts.proc is not None and ts.proc.poll() is None
        assert supervisor.exits[0].startswith("exit -9")
        assert doc.status_code == 200 and doc.json()["t"] == "still here"
    finally:
        supervisor.stop()
    # Stopped on purpose after the supervisor: it stays stopped.
    ts.stop()
    time.sleep(0.6)
    assert ts.proc is None and supervisor.restarts == 1
