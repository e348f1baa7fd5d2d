"""HTTP/1.1 to Typesense with less CPU a request than httpx's default transport.

Every recall sends one ``POST /multi_search`` and every outbox batch its
imports; under a fused recall's load the service spent 2.3 ms of CPU a
recall inside httpcore (benchmarks/results/recall-profile-s36-fused-base.md),
more than the rest of the Typesense source. :class:`LeanTransport` is an
``httpx`` transport (the client, its timeouts and its errors stay httpx's)
that does what a request to a Typesense node needs and nothing else: plain
``http`` (any other scheme goes to httpx's own transport), keep-alive
connections on asyncio streams, the request written as one buffer, and the
answer read by ``Content-Length`` or chunked.

Errors are httpx's: a connect that fails or times out is ``ConnectError`` /
``ConnectTimeout``, a write ``WriteError`` / ``WriteTimeout``, a read
``ReadError`` / ``ReadTimeout``, and an answer that breaks HTTP/1.1 (or ends
before it is whole) ``RemoteProtocolError``. The status line ``HTTP/1.1 0``
that a Typesense 0.24.1 node answers while its cluster has no leader is such
an error, and its message holds that status line, as h11's does. A kept-alive
connection the node closed is found before it is used, and a request whose
reused connection ends before any byte of the answer is sent once more on a
new one (the requests Braid sends are searches and upserts: sending one
twice changes nothing). A connection is kept only after a whole answer that
lets it stay open, so a request cancelled midway never leaves one half read.

Timeouts are the request's (httpx passes them): ``connect`` for opening a
connection, ``write`` for sending the request, ``read`` for the whole answer.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import httpx

__all__ = ["LeanTransport"]

#: Idle connections kept per node.
KEEP_ALIVE = 32

#: The longest header block read (Typesense's are a few hundred bytes).
_MAX_HEAD = 64 * 1024


class _Stale(Exception):
    """A reused connection ended before any byte of the answer."""


class _Connection:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def usable(self) -> bool:
        """Not closed by either end while it was idle."""
        return not (self.reader.at_eof() or self.writer.is_closing())

    def close(self) -> None:
        self.writer.close()


def _timeout(request: httpx.Request, name: str) -> float | None:
    value: Any = request.extensions.get("timeout", {}).get(name)
    return None if value is None else float(value)


class LeanTransport(httpx.AsyncBaseTransport):
    """Keep-alive HTTP/1.1 over asyncio streams for ``http`` URLs; others go to
    ``httpx.AsyncHTTPTransport()``."""

    def __init__(self, *, keep_alive: int = KEEP_ALIVE) -> None:
        self._keep_alive = keep_alive
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._other: httpx.AsyncHTTPTransport | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme != "http":
            if self._other is None:
                self._other = httpx.AsyncHTTPTransport()
            return await self._other.handle_async_request(request)
        key = (url.host, url.port or 80)
        head = self._head(request, await request.aread())
        conn = self._take(key)
        if conn is not None:
            try:
                return await self._exchange(key, conn, request, head, reused=True)
            except _Stale:
                pass
        conn = await self._connect(key, request)
        try:
            return await self._exchange(key, conn, request, head, reused=False)
        except _Stale:
            raise httpx.RemoteProtocolError("server disconnected without sending a response", request=request) from None

    async def aclose(self) -> None:
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()
        if self._other is not None:
            await self._other.aclose()

    @staticmethod
    def _head(request: httpx.Request, body: bytes) -> bytes:
        """The request as sent: request line, headers (httpx's: Host,
        Content-Length, ...), body."""
        lines = [request.method.encode() + b" " + request.url.raw_path + b" HTTP/1.1"]
        lines += [name + b": " + value for name, value in request.headers.raw]
        return b"\r\n".join(lines) + b"\r\n\r\n" + body

    def _take(self, key: tuple[str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.usable():
                return conn
            conn.close()
        return None

    def _give_back(self, key: tuple[str, int], conn: _Connection) -> None:
        idle = self._idle.setdefault(key, [])
        if len(idle) < self._keep_alive:
            idle.append(conn)
        else:
            conn.close()

    async def _connect(self, key: tuple[str, int], request: httpx.Request) -> _Connection:
        try:
            async with asyncio.timeout(_timeout(request, "connect")):
                reader, writer = await asyncio.open_connection(*key, limit=_MAX_HEAD)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connecting to {key[0]}:{key[1]} timed out", request=request) from exc
        except OSError as exc:
            # "Connection refused" (asyncio's own text repeats the address the client names).
            reason = os.strerror(exc.errno) if exc.errno else str(exc) or type(exc).__name__
            raise httpx.ConnectError(reason, request=request) from exc
        return _Connection(reader, writer)

    async def _exchange(
        self, key: tuple[str, int], conn: _Connection, request: httpx.Request, head: bytes, *, reused: bool
    ) -> httpx.Response:
        """Send ``head`` on ``conn`` and read the answer; ``conn`` is given back
        (kept alive) after a whole answer that allows it, else closed."""
        kept = False
        try:
            try:
                async with asyncio.timeout(_timeout(request, "write")):
                    conn.writer.write(head)
                    await conn.writer.drain()
            except TimeoutError as exc:
                raise httpx.WriteTimeout("sending the request timed out", request=request) from exc
            except OSError as exc:
                if reused:
                    raise _Stale from exc
                raise httpx.WriteError(str(exc) or type(exc).__name__, request=request) from exc
            try:
                async with asyncio.timeout(_timeout(request, "read")):
                    status, headers, body, keep = await _read_answer(conn.reader, request, reused=reused)
            except TimeoutError as exc:
                raise httpx.ReadTimeout("reading the answer timed out", request=request) from exc
            except (ConnectionError, OSError) as exc:
                if reused and isinstance(exc, ConnectionResetError):
                    raise _Stale from exc
                raise httpx.ReadError(str(exc) or type(exc).__name__, request=request) from exc
            if keep and request.method != "HEAD":
                self._give_back(key, conn)
                kept = True
            return httpx.Response(status, headers=headers, content=body, request=request)
        finally:
            if not kept:
                conn.close()


async def _read_answer(
    reader: asyncio.StreamReader, request: httpx.Request, *, reused: bool
) -> tuple[int, list[tuple[bytes, bytes]], bytes, bool]:
    """``(status, headers, body, keep_alive)`` of one answer."""
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if reused and not exc.partial:
            raise _Stale from exc
        raise httpx.RemoteProtocolError(
            "server disconnected without sending a complete response", request=request
        ) from exc
    except asyncio.LimitOverrunError as exc:
        raise httpx.RemoteProtocolError("the answer's headers are too long", request=request) from exc
    status_line, *lines = raw[:-4].split(b"\r\n")
    version, _, rest = status_line.partition(b" ")
    code = rest[:3].rstrip()
    if not version.startswith(b"HTTP/1.") or not code.isdigit():
        raise httpx.RemoteProtocolError(f"malformed status line {status_line[:80]!r}", request=request)
    status = int(code)
    if status < 100:
        # Typesense's "no leader" answer; the client tells it by this text.
        raise httpx.RemoteProtocolError(f"{version.decode()} {status} status line: no status", request=request)
    headers: list[tuple[bytes, bytes]] = []
    length, chunked, keep = -1, False, version != b"HTTP/1.0"
    for line in lines:
        name, sep, value = line.partition(b":")
        if not sep:
            raise httpx.RemoteProtocolError(f"malformed header line {line[:80]!r}", request=request)
        name, value = name.strip(), value.strip()
        lower = name.lower()
        if lower == b"content-length":
            if not value.isdigit():
                raise httpx.RemoteProtocolError(f"malformed Content-Length {value[:80]!r}", request=request)
            length = int(value)
        elif lower == b"transfer-encoding":
            chunked = value.lower().endswith(b"chunked")
            continue  # the body is given whole: httpx must not decode it again
        elif lower == b"connection":
            keep = b"close" not in value.lower() if keep else b"keep-alive" in value.lower()
        headers.append((name, value))
    try:
        if request.method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            body = b""
        elif chunked:
            parts = []
            while True:
                size_line = await reader.readuntil(b"\r\n")
                size = int(size_line.split(b";", 1)[0].strip() or b"x", 16)
                if size == 0:
                    # Trailers (none from Typesense) end with an empty line.
                    while await reader.readuntil(b"\r\n") != b"\r\n":
                        pass
                    break
                parts.append(await reader.readexactly(size + 2))
            body = b"".join(p[:-2] for p in parts)
        elif length >= 0:
            body = await reader.readexactly(length)
        else:
            # Neither: the body runs to the end of the connection.
            body = await reader.read()
            keep = False
    except asyncio.IncompleteReadError as exc:
        raise httpx.RemoteProtocolError("server disconnected before the answer was whole", request=request) from exc
    except ValueError as exc:
        raise httpx.RemoteProtocolError(f"malformed chunk size ({exc})", request=request) from exc
    return status, headers, body, keep
