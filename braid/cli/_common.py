"""What every ``braid`` command shares: the typer app, the two consoles, the
connection options, and how an error ends a command (one line, exit 2)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from ..client import Client
from ..errors import BraidError, ConnectError, Forbidden, HTTPError, RateLimited, Unauthorized
from ..retry import Retry

__all__ = [
    "ADMIN_KEY",
    "AGENT_KEY",
    "URL",
    "app",
    "connect",
    "err",
    "fail",
    "out",
    "reporting",
]

app = typer.Typer(
    name="braid",
    help="Braid: hybrid retrieval for AI-agent memory. Serve it, load memories, recall, reindex, manage keys.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)

#: What a command prints as its result (the block, a key): stdout, pipeable.
out = Console(highlight=False, soft_wrap=True)
#: Progress, tables about the run, warnings and errors: stderr.
err = Console(stderr=True, highlight=False, soft_wrap=True)

URL = Annotated[
    str,
    typer.Option(
        "--url", envvar="BRAID_URL", help="The service's base URL.", show_default=True, rich_help_panel="Connection"
    ),
]
AGENT_KEY = Annotated[
    str | None,
    typer.Option(
        "--key",
        envvar="BRAID_API_KEY",
        help="API key (its tenant is the one written to and recalled from).",
        show_default=False,
        rich_help_panel="Connection",
    ),
]
ADMIN_KEY = Annotated[
    str | None,
    typer.Option(
        "--admin-key",
        envvar="BRAID_ADMIN_KEY",
        help="Admin API key.",
        show_default=False,
        rich_help_panel="Connection",
    ),
]


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``braid: error: <message>`` on stderr and exit with ``code``."""
    err.print(f"[bold red]braid: error:[/] {escape(message)}")
    raise typer.Exit(code)


def _explain(error: BraidError, url: str) -> str:
    if isinstance(error, ConnectError):
        return f"cannot reach Braid at {url} ({error}); is it running? (--url or BRAID_URL)"
    if isinstance(error, Unauthorized):
        return f"{error.detail} (--key / BRAID_API_KEY, or --admin-key / BRAID_ADMIN_KEY for admin commands)"
    if isinstance(error, Forbidden):
        return f"{error.detail} (--admin-key / BRAID_ADMIN_KEY)"
    if isinstance(error, RateLimited):
        return f"{error.detail} (still limited after retrying)"
    if isinstance(error, HTTPError):
        return f"{error.detail} ({error.status} on {error.method} {error.path})"
    return str(error)


@contextmanager
def reporting(url: str) -> Iterator[None]:
    """Turn a :class:`~braid.BraidError` into one line on stderr and exit 2."""
    try:
        yield
    except BraidError as error:
        fail(_explain(error, url))


def connect(url: str, key: str | None, *, needs_key: bool = True, timeout: float = 30.0, attempts: int = 4) -> Client:
    """A client for a command: retries announced on stderr."""
    if needs_key and not key:
        fail("no API key: pass --key (or --admin-key) or set BRAID_API_KEY (BRAID_ADMIN_KEY for admin commands)")

    def announce(error: BraidError, attempt: int, wait: float) -> None:
        err.print(f"[yellow]braid: {escape(str(error))}; retry {attempt} in {wait:.1f} s[/]")

    import httpx

    return Client(
        url,
        key,
        timeout=httpx.Timeout(timeout, connect=5.0),
        retry=Retry(attempts=attempts, total_s=max(30.0, timeout)),
        on_retry=announce,
    )
