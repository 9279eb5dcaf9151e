"""One name per thing: an approval's timer names an MCP tool as its activity does."""

from __future__ import annotations

from refloop.contract.mcp import McpToolInfo
from refloop.contract.messages import ToolCall
from refloop.workflows.approval_phase import approval_label

TOGGLE = McpToolInfo(name="everything__toggle-simulated-logging", server="everything",
                     tool="toggle-simulated-logging")


def test_an_mcp_tool_is_named_server_colon_tool_as_its_activity_summary_says():
    call = ToolCall(id="1", name=TOGGLE.name, arguments={})
    label = approval_label(call, {TOGGLE.name: TOGGLE})
    assert label == "everything: toggle-simulated-logging"  # the MCP call's summary
    assert "__" not in label


def test_a_built_in_tool_keeps_its_name_and_its_path():
    call = ToolCall(id="1", name="write_file", arguments={"path": "a.txt", "content": "x"})
    assert approval_label(call, {TOGGLE.name: TOGGLE}) == "write_file a.txt"
