"""`refloop mcp`: refloop as an MCP server over stdio."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from typing import Any

from mcp_types import INVALID_REQUEST, PARSE_ERROR

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
        await run_stdio(build_mcp_server(lambda: deps))
    return 0


def line_refusal(line: str) -> tuple[int, str] | None:
    """(JSON-RPC 2.0 error code, message) for a line that is no JSON-RPC message, else None
    (the SDK parses it). Checked on the raw line: the SDK's parser reads an object `id` as
    no id at all, and answers that request as a notification, with nothing."""
    try:
        value = json.loads(line)
    except ValueError:
        return PARSE_ERROR, "Parse error: the line is not JSON"
    if not isinstance(value, dict):
        return INVALID_REQUEST, "Invalid Request: a JSON-RPC message is a JSON object"
    if "id" in value and (isinstance(value["id"], bool)
                          or not isinstance(value["id"], str | int)):
        return INVALID_REQUEST, "Invalid Request: an id is a string or an integer"
    return None


def jsonrpc_error(code: int, message: str) -> Any:
    """The answer to a malformed line: `id` null, since no id could be read from it."""
    from mcp_types import ErrorData, JSONRPCError

    return JSONRPCError(jsonrpc="2.0", id=None, error=ErrorData(code=code, message=message))


def sdk_refusal(err: Exception) -> tuple[int, str]:
    """A line the SDK's parser refused that passed line_refusal (`"jsonrpc": "1.0"`...)."""
    from pydantic import ValidationError

    if isinstance(err, ValidationError) and any(e.get("type") == "json_invalid"
                                                for e in err.errors()):
        return PARSE_ERROR, "Parse error: the line is not JSON"
    return INVALID_REQUEST, ("Invalid Request: not a JSON-RPC 2.0 request, notification or "
                             "response")


class CheckedLines:
    """stdin's lines for the SDK's reader, minus the malformed ones: each of those is
    answered on the wire (once the wire is there) and never reaches the SDK."""

    def __init__(self, lines: Any) -> None:
        import anyio

        self.lines = lines
        self.wire_out: Any = None
        self.wired = anyio.Event()

    async def __aiter__(self) -> AsyncIterator[str]:
        from mcp.shared.message import SessionMessage

        async for line in self.lines:
            refusal = line_refusal(line)
            if refusal is None:
                yield line
                continue
            await self.wired.wait()
            await self.wire_out.send(SessionMessage(jsonrpc_error(*refusal)))


async def run_stdio(server: Any) -> None:
    """The SDK's stdio transport (its claim of fd 0 and 1 kept: stray output of a handler
    or child misses the wire), with an answer to every malformed line: the SDK hands them
    to the session as exceptions, which it only logs, and the client waits for nothing."""
    import anyio
    from mcp.server import stdio
    from mcp.shared._context_streams import create_context_streams
    from mcp.shared.message import SessionMessage

    lowlevel = server._lowlevel_server  # run_stdio_async has no hook for the streams
    buffer, release = stdio._claim_fd(0, sys.stdin, "rb", stdio._open_stdin_diversion)
    checked = CheckedLines(anyio.wrap_file(stdio._UnownedTextWrapper(
        buffer, encoding="utf-8", errors="replace")))
    try:
        async with stdio.stdio_server(stdin=checked) as (wire_in, wire_out):
            checked.wire_out = wire_out
            checked.wired.set()
            to_server, from_wire = create_context_streams[SessionMessage | Exception](0)

            async def sort_lines() -> None:
                async with to_server:
                    async for item in wire_in:
                        if isinstance(item, Exception):
                            await wire_out.send(SessionMessage(jsonrpc_error(
                                *sdk_refusal(item))))
                        else:
                            await to_server.send(item)

            async with anyio.create_task_group() as group:
                group.start_soon(sort_lines)
                await lowlevel.run(from_wire, wire_out,
                                   lowlevel.create_initialization_options())
                group.cancel_scope.cancel()
    finally:
        if release is not None:
            release()
