"""`python -m service` with `server.workers: 2`: two child processes serve the
port on one embedded stack; /metrics sums them; an admin reload and SIGHUP
reach both; a child that dies is started again; Ctrl-C stops everything; a
child that cannot start stops the service with exit status 1."""

from __future__ import annotations

import re
import signal
import socket
import time
from pathlib import Path

import httpx
import psutil

from config import DEFAULT_CONFIG_PATH
from deploy.embedded import free_port

from .test_cli import descendants_and_servers, home, read_output, start, stop, wait_healthy

__all__ = ["home"]

AGENT = "agent-key-0123456789"
ADMIN = "admin-key-0123456789"


def _config(home: Path, top_k: int = 10) -> None:
    text = DEFAULT_CONFIG_PATH.read_text()
    text = text.replace("searchTopK: 10", f"searchTopK: {top_k}")
    text = re.sub(r"(?m)^(server:\n(?:  .*\n|  #.*\n)*?)  workers: 1$", r"\1  workers: 2", text)
    text = text.replace(
        "  keys: []",
        f"  keys:\n    - {{tenant: default, role: agent, key: {AGENT}}}\n"
        f"    - {{tenant: default, role: admin, key: {ADMIN}}}",
    )
    (home / "braid.yaml").write_text(text)


def _workers(proc: psutil.Process) -> dict[int, psutil.Process]:
    """The service children by their number (BRAID_WORKER)."""
    found = {}
    for child in proc.children():
        try:
            if child.cmdline()[-2:] == ["-m", "service"]:
                found[int(child.environ()["BRAID_WORKER"])] = child
        except psutil.Error:
            continue  # ended meanwhile (the embedded servers' helpers do)
    return found


def _recalls(url: str, n: int) -> set[int]:
    """The item counts of ``n`` recalls, each on a new connection (the kernel picks the child)."""
    counts = set()
    for _ in range(n):
        r = httpx.post(
            f"{url}/v1/recall",
            json={"query": "what does the user have"},
            headers={"Authorization": f"Bearer {AGENT}"},
        )
        assert r.status_code == 200, r.text
        counts.add(len(r.json()["items"]))
    return counts


def _scraped(url: str, name: str) -> float:
    """The sum of a metric's samples named exactly ``name`` (any labels)."""
    body = httpx.get(f"{url}/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if line.split("{")[0].split(" ")[0] == name)


def test_two_workers_serve_reload_restart_and_stop_together(home: Path) -> None:
    _config(home)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start(home, port)
    try:
        wait_healthy(proc, url)
        parent = psutil.Process(proc.pid)
        deadline = time.monotonic() + 120
        while len(_workers(parent)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        workers = _workers(parent)
        assert sorted(workers) == [1, 2], read_output(proc)
        # The parent serves nothing itself; each child listens on the port.
        for child in workers.values():
            deadline = time.monotonic() + 120
            while not any(
                c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in child.net_connections("tcp")
            ):
                assert time.monotonic() < deadline, read_output(proc)
                time.sleep(0.2)
        assert not any(c.laddr.port == port for c in parent.net_connections("tcp"))

        memories = [{"content": "User drives a Honda Civic"}, {"content": "User owns a red bicycle"}]
        r = httpx.post(f"{url}/v1/memories", json={"memories": memories}, headers={"Authorization": f"Bearer {AGENT}"})
        assert r.status_code == 201, r.text
        assert _recalls(url, 30) == {2}

        # Both children counted, and every scrape sums them.
        (shared,) = home.glob("metrics-*")
        pids = {int(p.stem.rsplit("_", 1)[1]) for p in shared.glob("histogram_*.db")}
        assert pids == {w.pid for w in workers.values()}
        for _ in range(4):
            assert _scraped(url, "braid_recalls_total") == 30
            assert _scraped(url, "braid_memories_written_total") == 2

        # An admin reload reaches both children.
        _config(home, top_k=1)
        r = httpx.post(f"{url}/admin/config/reload", headers={"Authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 200, r.text
        deadline = time.monotonic() + 10
        while (counts := _recalls(url, 20)) != {1} and time.monotonic() < deadline:
            time.sleep(0.2)
        assert counts == {1}
        # So does SIGHUP to the parent.
        _config(home, top_k=10)
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while (counts := _recalls(url, 20)) != {2} and time.monotonic() < deadline:
            time.sleep(0.2)
        assert counts == {2}

        # A child that dies is started again; the sums keep its counts.
        before = _scraped(url, "braid_recalls_total")
        workers[2].kill()
        deadline = time.monotonic() + 120
        while (now := _workers(parent)).get(2) is None or now[2].pid == workers[2].pid:
            assert time.monotonic() < deadline, read_output(proc)
            time.sleep(0.2)
        assert now[1].pid == workers[1].pid
        wait_healthy(proc, url)
        assert _recalls(url, 10) == {2}
        assert _scraped(url, "braid_recalls_total") >= before + 10
    finally:
        output = stop(proc)
    assert proc.returncode == 0, output
    assert "starting it again" in output
    time.sleep(0.5)
    assert descendants_and_servers(proc, home) == []
    assert list(home.glob("metrics-*")) == []


def test_a_child_that_cannot_start_stops_the_service(home: Path) -> None:
    _config(home)
    port = free_port()
    # The port held by a socket that does not share it: the first child cannot bind.
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        proc = start(home, port)
        try:
            proc.wait(timeout=180)
        finally:
            output = stop(proc) if proc.poll() is None else "\n".join(read_output(proc))
    finally:
        holder.close()
    assert proc.returncode == 1, output
    assert "service process 1 exited" in output
    time.sleep(0.5)
    assert descendants_and_servers(proc, home) == []


def test_children_stop_when_the_parent_is_killed(home: Path) -> None:
    _config(home)
    port = free_port()
    proc = start(home, port)
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}")
        parent = psutil.Process(proc.pid)
        deadline = time.monotonic() + 120
        while len(workers := _workers(parent)) < 2:
            assert time.monotonic() < deadline, read_output(proc)
            time.sleep(0.2)
        proc.kill()  # no chance to stop its children
        proc.wait()
        gone, alive = psutil.wait_procs(list(workers.values()), timeout=30)
        assert alive == [], read_output(proc)
        assert "the parent service process is gone: stopping" in "\n".join(read_output(proc))
    finally:
        # The killed parent left the embedded Postgres and Typesense running.
        for p in descendants_and_servers(proc, home):
            p.kill()
