"""The ``braid`` command line (typer + rich).

Commands: ``serve``, ``ingest``, ``recall``, ``reindex``, ``health`` and
``keys`` (``create``, ``list``, ``rotate``, ``revoke``). A command module
registers itself on :data:`app` (``@app.command()``); a new one is imported
below. Errors print one line, ``braid: error: ...``, and exit 2.
"""

from __future__ import annotations

from . import commands, ingest, keys
from ._common import app

__all__ = ["app", "commands", "ingest", "keys", "main"]


def main() -> None:
    """The ``braid`` console script."""
    app()
