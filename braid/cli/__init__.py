"""The ``braid`` command line (typer + rich).

Commands: ``serve``, ``ingest``, ``recall``, ``reindex``, ``health``,
``keys`` (``create``, ``list``, ``rotate``, ``revoke``) and ``mcp``. A command module
registers itself on :data:`app` (``@app.command()``); a new one is imported
below. Errors print one line, ``braid: error: ...``, and exit 2.
"""

from __future__ import annotations

from rich.markup import escape

from . import commands, ingest, keys, mcp
from ._common import app, err

__all__ = ["app", "commands", "ingest", "keys", "main", "mcp"]


def main() -> None:
    """The ``braid`` console script. A file that cannot be read or written
    (the input, a checkpoint, a config) ends it like any error: one line, exit 2."""
    try:
        app()
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        err.print(f"[bold red]braid: error:[/] {escape(where + (exc.strerror or str(exc)))}")
        raise SystemExit(2) from None
