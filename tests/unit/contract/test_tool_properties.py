"""Tool properties: defaults per kind, the built-ins' table, at-most-once, activity options,
MCP properties from the server's configuration, and the task rules and feedback reading
them."""

from __future__ import annotations

from datetime import timedelta

import pytest

from refloop.contract.mcp import McpToolInfo, mcp_tool_properties
from refloop.contract.messages import ToolCall
from refloop.contract.tool_catalog import TOOLS, tool_activity_options, tool_properties
from refloop.contract.tool_properties import (
    CONTROL,
    TOOL_ACTIVITY,
    ToolActivityOptions,
    ToolProperties,
)
from refloop.tools.output import tool_feedback
from refloop.tools.task_rules import TaskRules, constraints_for, load_task_rules
from refloop.workflows.approval_phase import needs_approval

READS = {"list_dir", "read_file", "glob_file_search", "grep", "search_semantic"}
WRITES = {"write_file", "apply_patch", "undo_patch", "str_replace_based_edit_tool",
          "json_edit_tool"}


def test_every_built_in_declares_its_kind():
    kinds = {name: d.properties.kind for name, d in TOOLS.items()}
    assert {n for n, k in kinds.items() if k == "read"} == READS
    assert {n for n, k in kinds.items() if k == "write"} == WRITES
    assert {n for n, k in kinds.items() if k == "execute"} == {"run_cmd"}
    assert tool_properties("complete_step") is CONTROL
    assert tool_properties("teleport") is None


def test_defaults_follow_the_kind():
    read, write = ToolProperties(kind="read"), ToolProperties(kind="write")
    execute, control = ToolProperties(kind="execute"), ToolProperties(kind="control")
    assert read.windowed and read.expects_output and read.idempotent and not read.reviewed
    assert write.reviewed and not write.windowed and not write.idempotent
    assert execute.windowed and not execute.reviewed and not execute.idempotent
    assert control.approval == frozenset() and control.idempotent
    with pytest.raises(ValueError, match="tool kind"):
        ToolProperties(kind="delete")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="approval mode"):
        ToolProperties(kind="read", approval=frozenset({"sometimes"}))


@pytest.mark.parametrize("mode, expected", [
    ("auto", set()),
    ("confirm_writes", WRITES | {"run_cmd"}),
    ("confirm_all", READS | WRITES | {"run_cmd"}),
])
def test_approval_per_mode(mode, expected):
    waiting = {name for name in [*TOOLS, "complete_step"]
               if needs_approval(mode, ToolCall(id="1", name=name, arguments={}),
                                 tool_properties(name))}
    assert waiting == expected


def test_a_read_only_sub_command_is_a_read():
    edit = tool_properties("str_replace_based_edit_tool")
    assert edit.kind_of({"command": "view"}) == "read"
    assert edit.kind_of({"command": "insert"}) == "write"
    assert not edit.needs_approval("confirm_writes", {"command": "view"})
    assert edit.needs_approval("confirm_writes", {"command": "str_replace"})
    assert not edit.edit_reviewed({"command": "undo_edit"})


def test_a_tool_that_is_not_safe_to_repeat_runs_once():
    run_cmd = tool_properties("run_cmd")
    assert not run_cmd.retry_safe and run_cmd.activity.max_attempts == 1
    assert tool_activity_options("run_cmd").kwargs()["retry_policy"].maximum_attempts == 1
    # Journaled edits and reads are retried after a crash.
    for name in ("write_file", "read_file", "apply_patch"):
        assert tool_properties(name).retry_safe
        assert tool_activity_options(name).kwargs()["retry_policy"].maximum_attempts == 3
    journaled = ToolProperties(kind="execute", journaled=True)
    assert journaled.activity.max_attempts == 3
    with pytest.raises(ValueError, match="at most once"):
        ToolProperties(kind="execute", activity=ToolActivityOptions(max_attempts=2))


def test_activity_options_are_the_call_sites_keyword_arguments():
    options = ToolActivityOptions(start_to_close=timedelta(seconds=5), heartbeat=None,
                                  max_attempts=2)
    kwargs = options.kwargs()
    assert kwargs["start_to_close_timeout"] == timedelta(seconds=5)
    assert kwargs["heartbeat_timeout"] is None
    assert kwargs["retry_policy"].maximum_attempts == 2
    assert kwargs["retry_policy"].non_retryable_error_types == ["UnknownToolError"]
    assert tool_activity_options("teleport") is TOOL_ACTIVITY


def mcp(confirm: bool, timeout_s: float = 60.0) -> McpToolInfo:
    return McpToolInfo(name="git__x", server="git", tool="x", confirm=confirm,
                       timeout_s=timeout_s)


def test_mcp_properties_come_from_the_server_configuration():
    confirm = mcp_tool_properties(mcp(True, 20))
    plain = mcp_tool_properties(mcp(False).model_copy(update={"read_only": True}))
    assert confirm.kind == "write" and plain.kind == "read"
    assert all(confirm.needs_approval(mode, {})
               for mode in ("auto", "confirm_writes", "confirm_all"))
    assert [plain.needs_approval(m, {}) for m in ("auto", "confirm_writes", "confirm_all")] == [
        False, False, True]
    # A confirm tool is not known to be idempotent: one attempt; a read is retried.
    assert confirm.activity.max_attempts == 1 and plain.activity.max_attempts == 5
    assert confirm.activity.start_to_close == timedelta(seconds=50)
    assert confirm.activity.kwargs()["retry_policy"].non_retryable_error_types == [
        "McpConfigError"]
    assert plain.windowed and plain.expects_output and not plain.reviewed
    # Without readOnlyHint a tool is a write: approved under confirm_writes, run once.
    unsaid = mcp_tool_properties(mcp(False))
    assert unsaid.kind == "write" and unsaid.needs_approval("confirm_writes", {})
    assert not unsaid.needs_approval("auto", {}) and unsaid.activity.max_attempts == 1


def test_task_rules_read_the_properties():
    rules = load_task_rules()
    research = constraints_for("research", rules)
    assert set(research.allowed) >= READS  # reads are always allowed
    assert research.generation_tools == ["write_file"]  # `generates`
    # A rules file may still add names; it needs none to know the kinds.
    extra = TaskRules(read_only_tools=["git__git_log"], types={"t": {"allowed": []}})
    assert {"git__git_log", *READS} <= set(constraints_for("t", extra).allowed)


def test_a_new_read_tool_is_allowed_by_every_task_type():
    from pydantic import BaseModel

    from refloop.tools.base import tool

    class Args(BaseModel):
        q: str

    @tool("lookup_words", Args, "Look a word up.", kind="read")
    async def lookup_words(ctx, args):  # pragma: no cover (never called)
        raise AssertionError

    try:
        assert "lookup_words" in constraints_for("research", load_task_rules()).allowed
    finally:
        TOOLS.pop("lookup_words")


def test_feedback_windows_only_windowed_tools():
    text = "\n".join(f"line {n}" for n in range(2000)) + "\nthe zebra\n" + "tail\n" * 10
    windowed = tool_feedback(text, tool_properties("grep"), ["zebra"], 1000)
    assert "[windowed around: zebra" in windowed and "the zebra" in windowed
    assert tool_feedback(text, tool_properties("write_file"), ["zebra"], 1000) == text
