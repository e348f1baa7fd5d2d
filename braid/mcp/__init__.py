"""Braid as an MCP server (``pip install 'braid[mcp]'``), on the official
``mcp`` SDK: tools ``recall`` (the memory block for a query) and
``remember`` (store a memory), over stdio or streamable HTTP.

    braid mcp                                   # stdio, for an MCP host
    braid mcp --transport http --port 8081      # streamable HTTP at http://127.0.0.1:8081/mcp
    python -m braid.mcp                         # the same as braid mcp

Braid's URL and API key come from ``BRAID_URL`` and ``BRAID_API_KEY`` (or
``--url`` / ``--key``); the key's tenant is the only one the tools reach.
:func:`create_server` builds the server for use in code.
"""

from __future__ import annotations

try:
    import mcp.server.mcpserver  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("braid.mcp needs the MCP SDK: pip install 'braid[mcp]'") from exc

from .server import INSTRUCTIONS, RecalledMemory, RecallOutput, RememberOutput, create_server

__all__ = ["INSTRUCTIONS", "RecallOutput", "RecalledMemory", "RememberOutput", "create_server"]
