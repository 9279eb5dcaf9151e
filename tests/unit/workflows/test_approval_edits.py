"""Approving with edited arguments and the approval wait: the pure rules, without Temporal."""

from __future__ import annotations

from refloop.contract.activity_io import ApprovalDecision, ToolResult
from refloop.contract.mcp import McpToolInfo
from refloop.contract.messages import ToolCall
from refloop.workflows.approval_phase import (
    approved_call,
    decided_event,
    edit_refusal,
    wait_words,
    waiting_call,
    with_edit_note,
)
from refloop.workflows.state import TurnState

WRITE = ToolCall(id="c1", name="write_file", arguments={"path": "a.md", "content": "a"})
MCP = McpToolInfo(name="git__git_add", server="git", tool="git_add", parameters={
    "type": "object", "required": ["repo_path", "files"],
    "properties": {"repo_path": {"type": "string"},
                   "files": {"type": "array", "items": {"type": "string"}}}})


def edit(arguments, approved=True, call=WRITE, tools=None):
    return edit_refusal(call, ApprovalDecision(call_id="1.0", approved=approved,
                                               arguments=arguments), tools or {})


def test_built_in_arguments_are_checked_as_the_registry_checks_the_model_s():
    assert edit(None) is None and edit({"path": "b.md", "content": "b"}) is None
    assert edit({"path": "b.md"}) == \
        "invalid arguments for write_file: content: Field required"
    assert edit({"path": "b.md", "content": "b", "mode": "x"}) == (
        "invalid arguments for write_file: unknown argument(s) mode; the tool takes "
        "path, content")
    # the model's own justification of a forbidden tool is no tool argument, and allowed
    assert edit({"path": "b.md", "content": "b", "justification": "needed"}) is None
    run = ToolCall(id="c", name="run_cmd", arguments={"command": "ls"})
    assert edit({"command": ""}, call=run).endswith("command: String should have at least "
                                                    "1 character")
    assert "go with an approval" in edit({"path": "b.md", "content": "b"}, approved=False)
    assert "approve or reject it as it is" in edit({"a": 1}, call=None)
    unknown = ToolCall(id="c", name="nosuch", arguments={})
    assert "no tool this task knows" in edit({"a": 1}, call=unknown)


def test_mcp_arguments_are_checked_against_the_server_s_schema():
    call = ToolCall(id="c", name=MCP.name, arguments={"repo_path": "/r", "files": ["a"]})
    tools = {MCP.name: MCP}
    assert edit({"repo_path": "/r", "files": ["b"]}, call=call, tools=tools) is None
    assert edit({"repo_path": "/r"}, call=call, tools=tools).endswith(
        "missing required argument(s) files")
    assert edit({"repo_path": "/r", "files": "b"}, call=call, tools=tools).endswith(
        "files: expected array")
    assert edit({"repo_path": True, "files": []}, call=call, tools=tools).endswith(
        "repo_path: expected string")
    assert "unknown argument(s) force" in edit({"repo_path": "/r", "files": [], "force": 1},
                                               call=call, tools=tools)


def test_the_call_runs_as_approved_and_the_event_keeps_both():
    same = ApprovalDecision(call_id="1.0", approved=True, arguments=dict(WRITE.arguments))
    assert approved_call(WRITE, same) is WRITE  # unchanged: no edit
    assert decided_event(same, WRITE, WRITE) == {"call_id": "1.0", "approved": True,
                                                 "comment": None}
    justified = WRITE.model_copy(update={"arguments": {**WRITE.arguments,
                                                       "justification": "why"}})
    changed = ApprovalDecision(call_id="1.0", approved=True,
                               arguments={"path": "a.md", "content": "b"})
    ran = approved_call(justified, changed)
    assert ran.arguments == {"path": "a.md", "content": "b", "justification": "why"}
    assert ran.id == WRITE.id and justified.arguments["content"] == "a"
    event = decided_event(changed, justified, ran)
    assert event["edited"] is True and event["original_arguments"]["content"] == "a"
    told = with_edit_note(ToolResult(ok=True, output="wrote a.md"), justified, ran)
    assert told.output.startswith("Note: the user edited this call's arguments")
    assert told.output.endswith("\nwrote a.md")
    assert with_edit_note(ToolResult(ok=True, output="x"), WRITE, WRITE).output == "x"


def test_the_waiting_call_is_read_from_the_turn_in_the_state():
    turn = TurnState(iteration=3, structured=True, calls=[WRITE, WRITE.model_copy(
        update={"id": "c2"})])
    assert waiting_call(turn, "3.1").id == "c2"
    for key in ("3.2", "2.0", "3", "x.y"):
        assert waiting_call(turn, key) is None
    assert waiting_call(None, "3.0") is None


def test_waits_in_words():
    assert [wait_words(s) for s in (1, 90, 600, 7200, 86400, 3 * 86400)] == [
        "1 s", "90 s", "10 min", "2 h", "1 day", "3 days"]
