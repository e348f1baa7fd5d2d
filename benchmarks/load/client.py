"""A lean HTTP/1.1 keep-alive client for the load benchmark, and nothing else.

The load run shares 2 cores between the client, the service, Postgres and
Typesense. Measured there, ``httpx.AsyncClient`` burns 2.1-2.6 ms of CPU per
request (of ~10 ms across all processes), CPU taken from the system under test.
``LeanClient`` does what wrk would: one host, plain TCP, pooled keep-alive
connections, a request assembled as bytes once, a response parsed from one
buffer (``Content-Length`` or chunked). It is a benchmark tool: the service
talks to Typesense with httpx, over a transport of the same kind
(``indexers/typesense/transport.py``). ``python -m benchmarks.load.client_cost``
compares the two clients' CPU per request.
"""

from __future__ import annotations

import asyncio
import itertools
from types import TracebackType
from typing import Protocol
from urllib.parse import urlsplit

__all__ = ["LeanClient", "LeanClientError", "Requester", "Spread"]


class LeanClientError(Exception):
    """The server broke HTTP/1.1: a malformed response, or a connection closed mid-response."""


class _Stale(Exception):
    """A kept-alive connection closed before any byte of the response arrived."""


def _parse(buf: bytearray) -> tuple[int, bytes, bool, int] | None:
    """``(status, body, keep_alive, bytes consumed)`` of a complete response in ``buf``, else None."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    status_line, *lines = bytes(buf[:end]).split(b"\r\n")
    version, _, rest = status_line.partition(b" ")
    if not version.startswith(b"HTTP/1.") or not rest[:3].isdigit():
        raise LeanClientError(f"malformed status line {status_line[:80]!r}")
    status = int(rest[:3])
    length, chunked, keep = -1, False, version != b"HTTP/1.0"
    for line in lines:
        name, sep, value = line.partition(b":")
        if not sep:
            raise LeanClientError(f"malformed header line {line[:80]!r}")
        name, value = name.strip().lower(), value.strip().lower()
        if name == b"content-length":
            if not value.isdigit():
                raise LeanClientError(f"malformed Content-Length {value[:80]!r}")
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = value.endswith(b"chunked")
        elif name == b"connection":
            keep = b"close" not in value if keep else b"keep-alive" in value
    pos = end + 4
    if chunked:
        parts = []
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                return None
            size_field = bytes(buf[pos:eol]).partition(b";")[0].strip()
            try:
                size = int(size_field, 16)
            except ValueError:
                raise LeanClientError(f"malformed chunk size {size_field[:80]!r}") from None
            if size == 0:  # last chunk, then optional trailers, then an empty line
                done = buf.find(b"\r\n\r\n", eol)
                return None if done < 0 else (status, b"".join(parts), keep, done + 4)
            if len(buf) < eol + size + 4:
                return None
            if buf[eol + 2 + size : eol + 4 + size] != b"\r\n":
                raise LeanClientError("chunk not followed by CRLF")
            parts.append(bytes(buf[eol + 2 : eol + 2 + size]))
            pos = eol + 4 + size
    if length < 0:
        if status in (204, 304):
            return status, b"", keep, pos
        raise LeanClientError("response has neither Content-Length nor chunked encoding")
    if len(buf) < pos + length:
        return None
    return status, bytes(buf[pos : pos + length]), keep, pos + length


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future[tuple[int, bytes, bool, int]] | None = None
        self.closed = False
        self.used = 0  # responses read so far

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.waiter is None or self.waiter.done():
            return
        try:
            done = _parse(self.buf)
        except LeanClientError as exc:
            self.waiter.set_exception(exc)
            self.close()
            return
        if done is not None:
            self.waiter.set_result(done)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            if self.used and not self.buf:
                self.waiter.set_exception(_Stale())
            else:
                error = LeanClientError(f"connection closed after {len(self.buf)} response bytes")
                error.__cause__ = exc
                self.waiter.set_exception(error)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    async def roundtrip(self, request: bytes) -> tuple[int, bytes, bool]:
        assert self.transport is not None and not self.buf
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        status, body, keep, consumed = await self.waiter
        self.used += 1
        del self.buf[:consumed]
        return status, body, keep and not self.buf  # stray bytes: do not trust the connection


class LeanClient:
    """Keep-alive HTTP/1.1 to one ``http://host:port``; at most ``max_connections`` open."""

    def __init__(self, url: str, max_connections: int = 64) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"LeanClient speaks plain http to one host, got {url!r}")
        self._host, self._port = parts.hostname, parts.port or 80
        self._authority = f"{parts.hostname}:{self._port}"
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()

    async def __aenter__(self) -> LeanClient:
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for conn in self._open:
            conn.close()
        self._open.clear()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports run connection_lost

    async def get(self, path: str, headers: dict[str, str] | None = None, timeout: float = 60) -> tuple[int, bytes]:
        return await self.request("GET", path, None, headers, timeout)

    async def post(
        self, path: str, body: bytes, headers: dict[str, str] | None = None, timeout: float = 60
    ) -> tuple[int, bytes]:
        return await self.request("POST", path, body, headers, timeout)

    async def request(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str] | None = None, timeout: float = 60
    ) -> tuple[int, bytes]:
        head = [f"{method} {path} HTTP/1.1\r\nHost: {self._authority}\r\n"]
        headers = headers or {}
        if body is not None:
            if not any(k.lower() == "content-type" for k in headers):
                head.append("Content-Type: application/json\r\n")
            head.append(f"Content-Length: {len(body)}\r\n")
        head.extend(f"{k}: {v}\r\n" for k, v in headers.items())
        head.append("\r\n")
        request = "".join(head).encode("latin-1") + (body or b"")
        async with asyncio.timeout(timeout):
            async with self._slots:
                conn = await self._take()
                try:
                    try:
                        status, data, keep = await conn.roundtrip(request)
                    except _Stale:  # the server dropped an idle connection: one fresh try
                        self._open.discard(conn)
                        conn = await self._connect()
                        status, data, keep = await conn.roundtrip(request)
                except BaseException:
                    self._drop(conn)
                    raise
                if keep:
                    self._idle.append(conn)
                else:
                    self._drop(conn)
                return status, data

    async def _take(self) -> _Connection:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and not conn.buf:  # bytes while idle: the server is confused
                return conn
            self._drop(conn)
        return await self._connect()

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(_Connection, self._host, self._port)
        self._open.add(conn)
        return conn

    def _drop(self, conn: _Connection) -> None:
        conn.close()
        self._open.discard(conn)


class Requester(Protocol):
    """What the load's timed loops send through: a :class:`LeanClient` or a :class:`Spread`."""

    async def post(
        self, path: str, body: bytes, headers: dict[str, str] | None = None, timeout: float = 60
    ) -> tuple[int, bytes]: ...


class Spread:
    """Requests sent round robin over one :class:`LeanClient` per URL, as a
    load balancer in front of several service processes would send them
    (each request to the next process, whichever client sends it)."""

    def __init__(self, urls: list[str], max_connections: int = 64) -> None:
        if not urls:
            raise ValueError("Spread needs at least one URL")
        self.clients = [LeanClient(url, max_connections) for url in urls]
        self._next = itertools.cycle(self.clients)

    async def __aenter__(self) -> Spread:
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()

    async def post(
        self, path: str, body: bytes, headers: dict[str, str] | None = None, timeout: float = 60
    ) -> tuple[int, bytes]:
        return await next(self._next).post(path, body, headers, timeout)
