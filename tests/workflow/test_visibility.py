"""What the Web UI and `temporal workflow list --query` see of a task on the dev server:
search attributes as the task moves, a summary on every activity, the plan as details."""

from __future__ import annotations

import asyncio
import json
import uuid

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus

from refloop.contract import visibility
from refloop.contract.activity_io import ApprovalDecision
from refloop.contract.task import TaskInput
from refloop.worker.main import build_worker
from refloop.workflows.agent import AgentTaskWorkflow
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import CODING, SUMMARY, call, final, plan_of, result_of


def summaries(history) -> list[str]:
    """The Web UI summary of every scheduled activity, in order."""
    out = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            out.append(json.loads(event.user_metadata.summary.data) if
                       event.user_metadata.HasField("summary") else None)
    return out


async def listed(client: Client, query: str, timeout_s: float = 15.0) -> list[str]:
    """Workflow ids the visibility store returns for `query` (it trails by a moment)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    ids: list[str] = []
    while asyncio.get_running_loop().time() < deadline:
        ids = [w.id async for w in client.list_workflows(query)]
        if ids:
            return ids
        await asyncio.sleep(0.3)
    return ids


async def test_search_attributes_summaries_and_details_follow_the_task(
        client, settings, scripted_llm, workspace, task_queue):
    model = unique_scenario(scripted_llm, {
        "intent": [CODING],
        "plan": [plan_of("write_file", "run_cmd")],
        "act": [call("write_file", path="a.txt", content="a"),
                call("complete_step", step=1, summary="ok"),
                call("run_cmd", command="cat a.txt"),
                call("complete_step", step=2, summary="ok"), final("ok")],
        "summary": [SUMMARY],
    })
    session = f"session-{uuid.uuid4().hex[:6]}"
    workflow_id = f"vis-{uuid.uuid4().hex[:8]}"
    task = "write a.txt then show it " + "with a long tail " * 30
    async with build_worker(client, settings, task_queue):
        handle = await client.start_workflow(
            AgentTaskWorkflow.run,
            TaskInput(task=task, workspace=str(workspace), model=model, session_id=session,
                      approval_mode="confirm_writes", enable_reflection=False),
            id=workflow_id, task_queue=task_queue,
            **visibility.start_metadata(task, str(workspace)))
        # Waiting on a person is a status one can filter on.
        waiting = await listed(client, f"WorkflowId = '{workflow_id}' AND "
                                       "RefloopStatus = 'waiting_approval'")
        assert waiting == [workflow_id]
        details = await handle.query("__temporal_workflow_metadata")
        assert details.current_details.startswith("**step 1/2: ")
        assert "- [ ] 2." in details.current_details and "`run_cmd`" in details.current_details
        assert {q.name: q.description for q in details.definition.query_definitions}[
            "progress"].startswith("Status, current plan step")
        updates = {u.name: u.description for u in details.definition.update_definitions}
        assert "call_id" in updates["decide_approval"]
        for call_id in ("1.0", "3.0"):
            # its approval is asked (a bare "1.0" also matched a number in any event)
            for _ in range(300):
                if any(e.type == "approval_required" and e.data.get("call_id") == call_id
                       for e in await handle.query(AgentTaskWorkflow.events, 0)):
                    break
                await asyncio.sleep(0.2)
            else:
                raise AssertionError(f"no approval asked for call {call_id} in 60 s")
            await handle.execute_update(AgentTaskWorkflow.decide_approval,
                                        ApprovalDecision(call_id=call_id, approved=True))
        result = await result_of(handle)
        assert result.status == "completed"
        history = await handle.fetch_history()

    found = await listed(client, visibility.list_query(
        status="completed", session_id=session, kind="agent_task"))
    assert found == [workflow_id]
    hostile = visibility.list_query(session_id=f"{session}' OR RefloopStatus != '")
    assert [w.id async for w in client.list_workflows(hostile)] == []
    described = await handle.describe()
    attributes = described.typed_search_attributes
    assert attributes.get(visibility.INTENT) == "CODING_TASK"
    assert attributes.get(visibility.TOTAL_TOKENS) == result.stats.usage.total_tokens > 0
    assert described.status == WorkflowExecutionStatus.COMPLETED
    summary = await described.static_summary()
    assert summary == visibility.task_summary(task) and len(summary) <= visibility.SUMMARY_CHARS
    assert (await described.static_details()).startswith(task)

    labels = summaries(history)
    assert all(labels), labels  # every activity says what it is
    assert labels[:3] == [f"describe workspace {workspace}", "intent", "plan"]
    acts = [label for label in labels if label.startswith("act")]
    assert acts == ["act · iteration 1 · step 1/2", "act · iteration 2 · step 1/2",
                    "act · iteration 3 · step 2/2", "act · iteration 4 · step 2/2",
                    "act · iteration 5"]
    assert "write_file a.txt" in labels and "run_cmd cat a.txt" in labels
    assert labels[-1] == "summary"
