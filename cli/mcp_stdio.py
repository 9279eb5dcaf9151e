"""`refloop mcp`: refloop as an MCP server over stdio."""

from __future__ import annotations

from refloop.api.mcp_server import McpDeps, build_mcp_server
from refloop.settings import Settings
from refloop.store.db import store_for
from refloop.worker.stack import embedded_stack


async def serve_stdio(settings: Settings) -> int:
    """`refloop mcp`: against TEMPORAL_ADDRESS if set, else the embedded stack."""
    store = store_for(settings.effective_database_url)
    async with embedded_stack(settings, with_worker=settings.temporal_address is None) \
            as stack:
        deps = McpDeps(stack.client, store, stack.settings)
        await build_mcp_server(lambda: deps).run_stdio_async()
    return 0
