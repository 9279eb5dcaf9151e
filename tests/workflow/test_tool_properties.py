"""A tool defined in one module, with no other registration, is approved, reviewed and
windowed like the built-in tool of its kind (real Temporal dev server, scripted model)."""

from __future__ import annotations

import importlib
import json

import pytest

from refloop.contract.activity_io import ApprovalDecision
from refloop.contract.task import TaskInput
from refloop.contract.tool_catalog import TOOLS, tool_properties, tool_specs
from refloop.worker.main import build_worker
from refloop.workflows.agent import AgentTaskWorkflow
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import CODING, SUMMARY, call, events_of, final, plan_of, result_of
from tests.workflow.helpers import start as start_workflow
from tests.workflow.test_approvals import wait_for

PASS = {"json": {"pass": True, "reasons": [], "suggestions": "", "summary": "looks good"}}


@pytest.fixture
def plugin_tool():
    """Import the module (that registers the tool); forget it afterwards, so other tests
    see the shipped registry."""
    from tests.workflow import plugin_tool as module

    importlib.reload(module)  # registers again if an earlier test imported it
    yield module.NAME
    TOOLS.pop(module.NAME, None)


def test_a_new_write_tool_gets_the_properties_of_its_kind(plugin_tool):
    new, builtin = tool_properties(plugin_tool), tool_properties("write_file")
    assert new is not None and builtin is not None
    for name in ("kind", "approval", "reviewed", "windowed", "expects_output", "retry_safe",
                 "activity"):
        assert getattr(new, name) == getattr(builtin, name), name
    assert plugin_tool in {spec.name for spec in tool_specs()}


def filler(keyword_line: str) -> str:
    """About 20 KB of lines with one line naming the task's keyword in the middle."""
    lines = [f"filler line {n} with nothing of interest in it" for n in range(400)]
    lines[200] = keyword_line
    return "\n".join(lines) + "\n"


def tool_messages(scripted_llm, model: str) -> list[str]:
    """The tool turns of the last model request, in order."""
    body = scripted_llm.requests(model=model, purpose="act")[-1]["body"]
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


async def test_a_new_write_tool_is_approved_reviewed_and_windowed_like_write_file(
        plugin_tool, client, settings, scripted_llm, workspace, task_queue):
    (workspace / "notes.md").write_text(filler("where the zebra sleeps"))
    (workspace / "big.txt").write_text(filler("the zebra line of big.txt"))
    model = unique_scenario(scripted_llm, {
        "intent": [CODING],
        "plan": [plan_of(plugin_tool, "read_file")],
        "act": [call(plugin_tool, path="notes.md", text="zebra appended\n"),
                call("read_file", path="big.txt"), final("appended and read")],
        "quality_review": [PASS],
        "summary": [SUMMARY],
    })
    async with build_worker(client, settings, task_queue):
        handle = await start_workflow(client, task_queue, TaskInput(
            task="append a zebra line to notes.md, then read big.txt", workspace=str(workspace),
            model=model, approval_mode="confirm_writes", enable_quality_review=True,
            quality_review_rules="Lines are plain text.", enable_reflection=False))
        pending = await wait_for(handle, "approval_required")
        assert pending["tool"] == plugin_tool  # confirm_writes stops it, as it stops write_file
        await handle.execute_update(AgentTaskWorkflow.decide_approval, ApprovalDecision(
            call_id=pending["call_id"], approved=True))
        result = await result_of(handle)

    assert result.status == "completed", result.answer
    assert [e["tool"] for e in events_of(result, "approval_required")] == [plugin_tool]
    assert (workspace / "notes.md").read_text().endswith("zebra appended\n")
    # Reviewed like write_file: one review of the file it produced.
    assert [(r.file_path, r.outcome) for r in result.quality_reviews] == [("notes.md", "passed")]
    review_request = json.dumps(scripted_llm.requests(model=model, purpose="quality_review")[0])
    assert "notes.md" in review_request and "zebra appended" in review_request
    # Windowed like write_file: its output is cut at the end, never windowed around the
    # task's keywords as the read of big.txt is.
    appended, read = tool_messages(scripted_llm, model)
    assert appended.startswith(f"[{plugin_tool}] ok\nfiller line 0")
    assert "[windowed around" not in appended
    assert "[windowed around" in read and "the zebra line of big.txt" in read
