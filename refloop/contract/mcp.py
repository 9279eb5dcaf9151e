"""MCP tools as workflows see them: the listing, a call's input, and the properties that
decide a tool's approval and retries. Plain data, no I/O."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel, Field

from refloop.contract.errors import McpConfigError, non_retryable
from refloop.contract.messages import ToolSpec
from refloop.contract.tool_properties import APPROVAL_MODES, ToolActivityOptions, ToolProperties


class McpToolInfo(BaseModel):
    """One listed tool, as recorded in history: what the model and the workflow need."""

    name: str  # server__tool, a valid function name
    server: str
    tool: str  # the server's own name
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)
    confirm: bool = False
    timeout_s: float = 60.0

    def spec(self) -> ToolSpec:
        return ToolSpec(name=self.name, description=self.description,
                        parameters=self.parameters)


class McpListInput(BaseModel):
    servers: list[str]
    workspace: str


class McpToolList(BaseModel):
    tools: list[McpToolInfo] = Field(default_factory=list)
    # The specs as one blob: model-facing activities read them by ref, not from history.
    specs_ref: str | None = None
    dropped: list[str] = Field(default_factory=list)  # over the cap: server/tool


class McpCallInput(BaseModel):
    call_id: str
    server: str
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    workspace: str
    keywords: list[str] = Field(default_factory=list)


# Beyond the server's own timeout_s: connecting, and a stdio server's start.
MCP_CALL_MARGIN = timedelta(seconds=30)
MCP_CALL_ATTEMPTS = 5  # a transport failure is retried on a fresh connection


def mcp_tool_properties(tool: McpToolInfo) -> ToolProperties:
    """The one place an MCP tool's properties are decided, from its server's configuration.

    A tool listed under `confirm` is a write: it waits for a decision in every approval mode
    (the operator asked for it) and, not known to be idempotent, runs at most once. Every
    other tool is a read, like the read-only built-ins: allowed by task constraints, an
    empty result is an anomaly, retried after a transport failure. Outputs are windowed;
    nothing is quality-reviewed (no workspace file to review)."""
    write = tool.confirm
    return ToolProperties(
        kind="write" if write else "read",
        approval=frozenset(APPROVAL_MODES) if write else None,
        reviewed=False,
        windowed=True,
        idempotent=not write,
        activity=ToolActivityOptions(
            start_to_close=timedelta(seconds=tool.timeout_s) + MCP_CALL_MARGIN,
            heartbeat=timedelta(seconds=10),
            max_attempts=1 if write else MCP_CALL_ATTEMPTS,
            non_retryable=tuple(non_retryable(McpConfigError)),
        ),
    )
