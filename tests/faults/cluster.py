"""A Typesense cluster for the fault tests: ``size`` embedded servers forming
one Raft cluster on loopback (:class:`EmbeddedTypesenseCluster`).

Each node is a :class:`deploy.embedded.EmbeddedTypesense` started with the
cluster's ``nodes`` file; the cluster can kill, pause and restart a node and
tell which one leads.
"""

from __future__ import annotations

import secrets
import signal
import time
from pathlib import Path

import httpx

from deploy.embedded import EmbeddedTypesense, free_port

__all__ = ["EmbeddedTypesenseCluster"]


class EmbeddedTypesenseCluster:
    """``size`` Typesense servers forming one Raft cluster on loopback (tests).

    Each node has its own data dir under ``home`` (``node0``, ``node1``...),
    its own api and peering ports, kept across restarts, and the same api
    key; one ``nodes`` file lists them all as ``127.0.0.1:<peering>:<api>``.
    """

    LEADER = 1
    FOLLOWER = 4

    def __init__(self, home: Path, size: int = 3, *, api_key: str | None = None) -> None:
        if size < 1:
            raise ValueError("a cluster needs at least one node")
        self.home = home.resolve()
        self.home.mkdir(parents=True, exist_ok=True)
        self.api_key = api_key or secrets.token_urlsafe(24)
        self.nodes_file = self.home / "nodes"
        self.nodes = [
            EmbeddedTypesense(
                self.home / f"node{i}",
                api_key=self.api_key,
                port=free_port(),
                peering_port=free_port(),
                nodes_file=self.nodes_file,
            )
            for i in range(size)
        ]
        self.nodes_file.write_text(",".join(f"127.0.0.1:{n.peering_port}:{n.port}" for n in self.nodes))

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    def start(self, i: int | None = None, *, timeout: float = 120.0) -> list[str]:
        """Start every node (or node ``i`` again, with its ports and data);
        return once a leader is elected and the started nodes are ready (a
        restarted node answers 503 until it is within ``--healthy-read-lag``
        writes of the leader)."""
        started = self.nodes if i is None else [self.nodes[i]]
        for node in started:
            node.spawn()
        deadline = time.monotonic() + timeout
        for node in started:
            node.wait_ready(max(deadline - time.monotonic(), 0.1))
        self.wait_leader(max(deadline - time.monotonic(), 0.1))
        return self.urls

    def kill(self, i: int) -> None:
        """SIGKILL node ``i``, as a crash would."""
        self.nodes[i].kill()

    def pause(self, i: int) -> None:
        """SIGSTOP node ``i``: it keeps its sockets but answers nothing (a hung
        server, or a host gone from the network). :meth:`resume` undoes it."""
        proc = self.nodes[i].proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGSTOP)

    def resume(self, i: int) -> None:
        proc = self.nodes[i].proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)

    def alive(self, i: int) -> bool:
        proc = self.nodes[i].proc
        return proc is not None and proc.poll() is None

    def state(self, i: int, timeout: float = 1.0) -> int | None:
        """Node ``i``'s Raft state from ``/debug`` (1 leader, 4 follower), or
        ``None`` if it does not answer."""
        if not self.alive(i):
            return None
        try:
            r = httpx.get(
                f"{self.nodes[i].url}/debug",
                headers={"X-TYPESENSE-API-KEY": self.api_key},
                timeout=timeout,
            )
            return int(r.json()["state"]) if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None

    def leader(self) -> int | None:
        """The index of the node that says it leads, if exactly one does."""
        leaders = [i for i in range(len(self.nodes)) if self.state(i) == self.LEADER]
        return leaders[0] if len(leaders) == 1 else None

    def wait_leader(self, timeout: float = 60.0, *, other_than: int | None = None) -> int:
        """Wait until one node leads (not ``other_than``); return its index."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = self.leader()
            if leader is not None and leader != other_than:
                return leader
            time.sleep(0.05)
        states = {i: self.state(i) for i in range(len(self.nodes))}
        raise RuntimeError(f"no Typesense leader after {timeout:.0f}s; states {states}")

    def stop(self) -> None:
        for i, node in enumerate(self.nodes):
            self.resume(i)  # a stopped process would ignore SIGTERM
            node.stop()
