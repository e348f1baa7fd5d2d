"""``python -m braid.mcp``: the Braid MCP server (``braid mcp``)."""

from ..cli.mcp import main

main()
