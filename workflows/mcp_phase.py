"""MCP tool servers in the agent workflow: one listing at task start, one activity a call."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from refloop.contract import activity_calls
    from refloop.contract.activity_io import ToolConstraints, ToolResult
    from refloop.contract.mcp import McpCallInput, McpListInput, mcp_tool_properties
    from refloop.contract.messages import ToolCall, ToolSpec

from refloop.workflows.agent_base import AgentBase


def with_mcp_reads(constraints: ToolConstraints | None,
                   read_tools: list[str]) -> ToolConstraints | None:
    """Read-only MCP tools are allowed wherever the task type lists allowed tools, as the
    read-only built-ins are; `forbidden` names MCP tools (server__tool) like any other."""
    if constraints is None or not constraints.allowed or not read_tools:
        return constraints
    allowed = sorted(set(constraints.allowed) | set(read_tools))
    return constraints.model_copy(update={"allowed": allowed})


class McpPhase(AgentBase):
    tools: list[ToolSpec]
    tool_names: list[str]

    def _adopt_mcp_tools(self) -> None:
        """Add the listed MCP tools to what the model is offered (also after a
        continue-as-new, from the state)."""
        specs = [tool.spec() for tool in self.state.mcp.tools.values()]
        self.tools = [*self.tools, *specs]
        self.tool_names = [spec.name for spec in self.tools]

    async def _list_mcp_tools(self) -> None:
        inp = self.state.input
        if not inp.mcp_servers:
            return
        listing = await self.activities.call(
            activity_calls.MCP_LIST_TOOLS,
            McpListInput(servers=inp.mcp_servers, workspace=inp.workspace),
            summary=", ".join(inp.mcp_servers),
        )
        self.state.mcp.tools = {tool.name: tool for tool in listing.tools}
        self.state.mcp.specs_ref = listing.specs_ref
        self._emit("mcp_tools", {"servers": inp.mcp_servers,
                                 "tools": [tool.name for tool in listing.tools],
                                 "dropped": listing.dropped})
        self._adopt_mcp_tools()

    def _mcp_read_tools(self) -> list[str]:
        return [name for name, tool in self.state.mcp.tools.items()
                if mcp_tool_properties(tool).kind == "read"]

    async def _call_mcp(self, call: ToolCall, call_id: str, keywords: list[str]) -> ToolResult:
        tool = self.state.mcp.tools[call.name]
        return await self.activities.call(
            activity_calls.MCP_CALL_TOOL,
            McpCallInput(
                call_id=call_id, server=tool.server, tool=tool.tool,
                arguments={k: v for k, v in call.arguments.items() if k != "justification"},
                workspace=self.state.input.workspace, keywords=keywords,
            ),
            summary=f"{tool.server}: {tool.tool}",
            options=mcp_tool_properties(tool).activity.as_options(),
        )
