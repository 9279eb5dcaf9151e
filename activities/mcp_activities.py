"""MCP activities: list the chosen servers' tools once per task, and call one tool.

Retry classes: a transport failure (a stdio server that died mid-call, an HTTP server gone)
raises and Temporal retries on a fresh connection. What would fail the same way again comes
back as an error result for the model, never retried, and never fails the task: a server
that cannot start or never answers `initialize` (its stderr tail said), a listing or an
input schema that is not valid, arguments the schema refuses, a result with `isError`. A
server the configuration does not name is a non-retryable failure. Results are capped.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from pydantic import TypeAdapter
from temporalio import activity
from temporalio.exceptions import ApplicationError

from refloop.activities.defn import implements
from refloop.activities.heartbeat import heartbeating
from refloop.contract import activity_calls
from refloop.contract.activity_io import ToolResult
from refloop.contract.errors import McpConfigError
from refloop.contract.mcp import (
    MAX_DESCRIPTION_CHARS,
    McpCallInput,
    McpListInput,
    McpToolInfo,
    McpToolList,
)
from refloop.contract.messages import ToolSpec
from refloop.mcp.config import McpServerConfig, choose, model_schema, tool_name
from refloop.mcp.pool import Connection, McpPool, McpStartError, McpTransportError
from refloop.settings import Settings
from refloop.store.db import Store
from refloop.tools.output import arguments_or_refusal, output_for_model

# What one task is offered at most (the chat APIs take 128 tools; the built-ins come first)
MAX_MCP_TOOLS = 96
# A result's text beyond this is cut before anything else reads it.
MAX_RESULT_CHARS = 1024 * 1024


_SPECS = TypeAdapter(list[ToolSpec])
_SPECS_CACHE: dict[str, list[ToolSpec]] = {}


async def mcp_specs(ref: str | None, get: Callable[[str], str]) -> list[ToolSpec]:
    """A task's MCP tool specs, stored once by the listing; content-addressed, so cached."""
    if ref is None:
        return []
    specs = _SPECS_CACHE.get(ref)
    if specs is None:
        specs = _SPECS_CACHE[ref] = _SPECS.validate_json(await asyncio.to_thread(get, ref))
        while len(_SPECS_CACHE) > 256:
            _SPECS_CACHE.pop(next(iter(_SPECS_CACHE)))
    return specs


def invalid_schema(schema: Any) -> str | None:
    """Why a server's input schema is not a JSON schema; None when it is one."""
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.exceptions.SchemaError as err:
        return f"{'.'.join(str(p) for p in err.absolute_path) or 'schema'}: {err.message}"
    except Exception as err:  # noqa: BLE001 - a schema that is not even a mapping
        return f"{type(err).__name__}: {err}"[:300]
    return None


def schema_error(schema: dict[str, Any], arguments: dict[str, Any]) -> str | None:
    """The schema's own message for arguments it refuses; None when they are valid."""
    import jsonschema

    validator = jsonschema.validators.validator_for(schema)(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
    if error is None:
        return None
    where = ".".join(str(p) for p in error.absolute_path) or "arguments"
    return f"{where}: {error.message}"


def is_refusal(err: Exception) -> bool:
    """A JSON-RPC error the server sent (bad params, unknown tool): the model should see it.
    A closed connection or a timeout is a transport failure: retried."""
    from mcp import MCPError
    from mcp_types.jsonrpc import CONNECTION_CLOSED, REQUEST_TIMEOUT

    return isinstance(err, MCPError) and err.code not in (CONNECTION_CLOSED, REQUEST_TIMEOUT)


def result_text(result: Any, cap: int = MAX_RESULT_CHARS) -> str:
    """A CallToolResult as text: its text blocks, else its structured content, else a
    description of what else it held; cut at `cap` characters, saying so."""
    parts = []
    for block in result.content or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource":
            resource = block.resource
            parts.append(getattr(resource, "text", None) or f"[resource {resource.uri}]")
        else:
            parts.append(f"[{kind} content]")
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(parts)
    if len(text) > cap:
        text = (f"{text[:cap]}\n[... the result was {len(text)} characters; cut at {cap} "
                "(the MCP result cap) ...]")
    return text


def annotated(tool: Any, override: Any) -> dict[str, bool | None]:
    """The tool's annotations, each replaced by the operator's word where given.

    A server's `readOnlyHint: true` is not taken on its word: nothing stops its process
    from writing (the workspace, or anything it talks to), and a read is retried and runs
    without approval. Only the operator's `properties` make an MCP tool a read; the
    server's claim is kept, as `declared_read_only`, for people to see."""
    hints = getattr(tool, "annotations", None)
    said = {"read_only": None,
            "declared_read_only": getattr(hints, "read_only_hint", None),
            "destructive": getattr(hints, "destructive_hint", None),
            "idempotent": getattr(hints, "idempotent_hint", None)}
    if override is not None:
        said.update({k: v for k, v in override.model_dump().items() if v is not None})
    return said


def needs_a_yes(tool: str, said: dict[str, bool | None], config: Any) -> bool:
    """Whether a call waits for a human in every approval mode, `auto` included: the
    operator listed it under `confirm`, or it may destroy (destructiveHint true, or not
    said by a tool that is not read-only: the MCP specification's default) and the
    operator did not list it under `unattended`. Decided here, at listing, into the
    recorded tool list: a history recorded before keeps its own answer on replay.

    A server that declares a tool read-only has said it is not destructive (the
    specification reads destructiveHint only when readOnlyHint is false): taken as far as
    an explicit `destructiveHint: false` is, though the tool stays a write (its readOnlyHint
    is not trusted to skip approval under `confirm_writes` or to retry it)."""
    said_harmless = said["read_only"] is True or said.get("declared_read_only") is True
    destructive = not said_harmless and said["destructive"] is not False
    return tool in config.confirm or (destructive and tool not in config.unattended)


class McpActivities:
    def __init__(self, settings: Settings, store: Store, pool: McpPool | None = None) -> None:
        self.settings = settings
        self.store = store
        self.pool = pool or McpPool(settings)

    async def _connect(self, server: str, workspace: str) -> Connection:
        try:
            return await self.pool.connection(server, workspace)
        except McpConfigError as err:
            raise ApplicationError(str(err), type=McpConfigError.__name__,
                                   non_retryable=True) from None

    @implements(activity_calls.MCP_LIST_TOOLS)
    async def list_tools(self, inp: McpListInput) -> McpToolList:
        try:
            chosen = choose(self.pool.config(), inp.servers)
        except McpConfigError as err:
            raise ApplicationError(str(err), type=McpConfigError.__name__,
                                   non_retryable=True) from None
        tools: list[McpToolInfo] = []
        dropped: list[str] = []
        taken: set[str] = set()
        async with heartbeating():
            for server, config in chosen.items():
                try:
                    connection = await self._connect(server, inp.workspace)
                except McpStartError as err:  # the task goes on without this server
                    dropped.append(f"{server}: {err}")
                    continue
                allowed = set(config.tools) if config.tools is not None else None
                for tool in connection.tools:
                    if allowed is not None and tool.name not in allowed:
                        continue
                    if len(tools) >= MAX_MCP_TOOLS:
                        dropped.append(f"{server}/{tool.name}")
                        continue
                    schema = model_schema(tool.input_schema)
                    problem = invalid_schema(schema)
                    if problem:  # the model API would refuse the whole tool list
                        dropped.append(f"{server}/{tool.name}: invalid input schema: {problem}")
                        continue
                    name = tool_name(server, tool.name, taken)
                    taken.add(name)
                    said = annotated(tool, config.properties.get(tool.name))
                    tools.append(McpToolInfo(
                        name=name, server=server, tool=tool.name,
                        description=(tool.description or tool.title or "")[
                            :MAX_DESCRIPTION_CHARS],
                        parameters=schema,
                        confirm=needs_a_yes(tool.name, said, config),
                        timeout_s=config.timeout_s, **said,
                    ))
        specs = json.dumps([t.spec().model_dump() for t in tools], ensure_ascii=False)
        ref = await asyncio.to_thread(self.store.put_blob, specs) if tools else None
        return McpToolList(tools=tools, specs_ref=ref, dropped=dropped)

    @implements(activity_calls.MCP_CALL_TOOL)
    async def call_tool(self, inp: McpCallInput) -> ToolResult:
        activity.logger.info("mcp %s: %s (%s)", inp.server, inp.tool, inp.call_id)
        config = self._server_config(inp.server)
        if config.tools is not None and inp.tool not in config.tools:
            return ToolResult(ok=False, error=f"E_POLICY: {inp.server} tool {inp.tool!r} is "
                                              "not in the server's allow list")
        arguments = await arguments_or_refusal(inp.arguments, self.store.get_blob)
        if isinstance(arguments, ToolResult):
            return arguments
        async with heartbeating():
            try:
                connection = await self._connect(inp.server, inp.workspace)
            except McpStartError as err:
                return ToolResult(ok=False, error=f"E_MCP_START: {err}")
            listed = next((t for t in connection.tools if t.name == inp.tool), None)
            if listed is None:
                return ToolResult(ok=False, error=f"E_UNKNOWN_TOOL: {inp.server} lists no "
                                                  f"tool {inp.tool!r}")
            schema = model_schema(listed.input_schema)
            problem = invalid_schema(schema)
            if problem:
                return ToolResult(ok=False, error=f"E_MCP_SCHEMA: {inp.server} gives {inp.tool} "
                                                  f"an invalid input schema ({problem})")
            problem = schema_error(schema, arguments)
            if problem:
                return ToolResult(ok=False, error=f"E_INVALID_ARGS: {problem}")
            try:
                async with self.pool.busy(connection):
                    result = await connection.session.call_tool(
                        inp.tool, arguments, read_timeout_seconds=config.timeout_s)
            except Exception as err:
                if is_refusal(err):  # a live server answered with a JSON-RPC error
                    return ToolResult(ok=False, error=f"E_MCP: {err}")
                await self.pool.drop(inp.server, inp.workspace, connection)
                raise McpTransportError(
                    f"MCP server {inp.server!r} failed during {inp.tool}: "
                    f"{type(err).__name__}: {err}") from None
        text = result_text(result)
        if result.is_error:
            return ToolResult(ok=False, error=f"E_TOOL: {text or 'the tool reported an error'}")
        # Every MCP tool's output is windowed (`mcp_tool_properties`).
        async with heartbeating():  # the call ran: a slow database must not look lost
            output = await output_for_model(text, True, inp.keywords,
                                            self.settings.refloop_blob_threshold_bytes,
                                            self.store.put_blob)
        return ToolResult(ok=True, output=output,
                          data={"server": inp.server, "tool": inp.tool})

    def _server_config(self, server: str) -> McpServerConfig:
        try:
            return self.pool.server_config(server)
        except McpConfigError as err:
            raise ApplicationError(str(err), type=McpConfigError.__name__,
                                   non_retryable=True) from None

    def activities(self) -> list[Any]:
        return [self.list_tools, self.call_tool]
