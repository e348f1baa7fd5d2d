"""benchmarks.common.Service does not outlive the benchmark that started it.

A benchmark process starts the real stack (the service, its embedded Postgres
and Typesense), then is stopped from outside as a user stops a long run:
SIGTERM stops the whole stack and removes its home; ``kill -9`` (no handler
can run) still stops every process of the stack, through the watchdog. A
replica (``Service.add_replica``, the load's ``--services``) serves the same
memories from the same backends and stops with its primary.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from benchmarks.common import ROOT, Service

_BENCHMARK = """\
import asyncio, json, sys
from benchmarks.common import Service

async def main():
    svc = Service(prefix="braid-watchdog-")
    try:
        pids = {
            "service": svc.proc.pid,
            "postgres": svc.postmaster_pid(),
            "typesense": int((svc.home / "typesense" / "typesense.pid").read_text()),
        }
        print(json.dumps({"home": str(svc.home), "pids": pids}), flush=True)
        await asyncio.sleep(600)
    finally:
        svc.stop()

asyncio.run(main())
"""


def _start() -> tuple[subprocess.Popen[str], Path, dict[str, int]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _BENCHMARK], cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"the benchmark exited with {proc.wait()} before its stack was up"
    started = json.loads(line)
    return proc, Path(started["home"]), started["pids"]


def _still_running(pids: dict[str, int], timeout: float) -> dict[str, int]:
    """The processes among ``pids`` still running after up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        left = {}
        for kind, pid in pids.items():
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    left[kind] = pid
            except psutil.NoSuchProcess:
                pass
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _kill_left(pids: dict[str, int]) -> None:
    for pid in pids.values():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_sigterm_stops_the_stack_and_removes_its_home() -> None:
    proc, home, pids = _start()
    try:
        assert home.is_dir() and _still_running(pids, 0) == pids
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) is not None
        left = _still_running(pids, 60)
        assert left == {}, f"still running after the benchmark's SIGTERM: {left}"
        assert not home.exists(), "the stack's home was left behind"
    finally:
        proc.kill()
        _kill_left(pids)
        shutil.rmtree(home, ignore_errors=True)


def test_a_killed_benchmark_leaves_no_process_of_its_stack_running() -> None:
    proc, home, pids = _start()
    try:
        assert _still_running(pids, 0) == pids
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        left = _still_running(pids, 90)
        assert left == {}, f"still running after the benchmark was killed: {left}"
    finally:
        _kill_left(pids)
        shutil.rmtree(home, ignore_errors=True)


def test_a_replica_serves_the_primarys_memories_and_stops_with_it() -> None:
    svc = Service(prefix="braid-replica-")
    replica = None
    try:
        replica = svc.add_replica()
        assert svc.urls == [svc.url, replica.url] and replica.url != svc.url
        # It started no backend of its own.
        assert not (replica.home / "postgres").exists() and not (replica.home / "typesense").exists()
        assert {svc.proc.pid, replica.proc.pid} <= {p.pid for p in svc.processes()["service"]}
        body = {"memories": [{"content": "The replica reads the primary's Postgres.", "kind": "note"}]}
        r = httpx.post(f"{svc.url}/v1/memories", json=body, headers=svc.headers, timeout=60)
        assert r.status_code == 201, r.text
        written = r.json()["ids"][0]
        r = httpx.post(
            f"{replica.url}/v1/recall",
            json={"query": "which Postgres does the replica read?"},
            headers=svc.headers,
            timeout=60,
        )
        assert r.status_code == 200, r.text
        assert written in [item["id"] for item in r.json()["items"]]
    finally:
        svc.stop()
    assert replica is not None
    assert replica.proc.poll() is not None, "the replica outlived its primary's stop()"
    assert not replica.home.exists() and not svc.home.exists()
