"""``braid mcp`` (and ``python -m braid.mcp``): run the Braid MCP server
(:mod:`braid.mcp`) over stdio or streamable HTTP.

Over stdio, stdout carries the protocol: nothing else is written there (logs
go to stderr). The SDK is imported only when the command runs, so ``braid``
works without the ``mcp`` extra.
"""

from __future__ import annotations

import ipaddress
from enum import StrEnum
from typing import Annotated

import typer
from rich.markup import escape

from ..client import DEFAULT_URL
from ._common import AGENT_KEY, URL, app, err, fail

__all__ = ["DEFAULT_PORT", "LogLevel", "Transport", "main", "mcp"]

#: The streamable HTTP transport's default port (Braid's own is 8080).
DEFAULT_PORT = 8081


class Transport(StrEnum):
    stdio = "stdio"
    http = "http"


class LogLevel(StrEnum):
    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"


@app.command(rich_help_panel="Service")
def mcp(
    transport: Annotated[
        Transport,
        typer.Option(help="stdio: for an MCP host that starts the server; http: streamable HTTP at /mcp."),
    ] = Transport.stdio,
    host: Annotated[str, typer.Option(help="Address the HTTP transport listens on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port of the HTTP transport.", min=1, max=65535)] = DEFAULT_PORT,
    log_level: Annotated[
        LogLevel,
        typer.Option(envvar="BRAID_LOG_LEVEL", case_sensitive=False, help="What is logged (on stderr)."),
    ] = LogLevel.INFO,
    url: URL = DEFAULT_URL,
    key: AGENT_KEY = None,
) -> None:
    """Run the Braid MCP server: tools `recall` (the memory block for a query) and
    `remember` (store a memory), in the tenant of the API key."""
    if not key:
        fail("no API key: pass --key or set BRAID_API_KEY (the MCP tools act in that key's tenant)")
    try:
        from ..mcp import create_server
    except ImportError as exc:
        fail(f"{exc} (the MCP server needs the mcp extra: pip install 'braid[mcp]')")
    server = create_server(url, key, log_level=log_level.value)
    if transport is Transport.stdio:
        server.run("stdio")
        return
    if not _loopback(host):
        warning = f"braid mcp: listening on {host}: anyone who reaches it uses Braid with this key's tenant"
        err.print(f"[yellow]{escape(warning)}[/]")
    err.print(escape(f"braid mcp: streamable HTTP at http://{_netloc(host, port)}/mcp, Braid at {url}"))
    server.run("streamable-http", host=host, port=port)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def main() -> None:
    """``python -m braid.mcp``: this command alone."""
    single = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode="markdown")
    single.command(context_settings={"help_option_names": ["-h", "--help"]})(mcp)
    single()
