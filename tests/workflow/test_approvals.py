"""Approvals through a validated workflow update, and cancellation."""

from __future__ import annotations

import asyncio
import json
import os
from datetime import datetime, timedelta

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.service import RPCError

from refloop.contract.activity_io import ApprovalDecision
from refloop.contract.task import TaskInput
from refloop.store.db import store_for
from refloop.worker.main import build_worker
from refloop.worker.replay import dump_history, replay_files
from refloop.workflows.agent import AgentTaskWorkflow
from refloop.workflows.approval_phase import needs_approval
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import (
    CODING,
    HISTORIES,
    SUMMARY,
    call,
    events_of,
    final,
    plan_of,
    result_of,
    start,
)

PASS = {"json": {"pass": True, "reasons": [], "suggestions": "", "summary": "ok"}}


def scenario() -> dict:
    return {"intent": [CODING], "plan": [plan_of("write_file")],
            "act": [call("read_file", path="."), call("write_file", path="a.txt", content="a"),
                    final("done")],
            "summary": [SUMMARY]}


async def wait_for(handle, kind: str) -> dict:
    for _ in range(200):
        try:
            found = [e for e in await handle.query(AgentTaskWorkflow.events, 0) if e.type == kind]
        except Exception:  # not picked up yet
            found = []
        if found:
            return found[0].data
        await asyncio.sleep(0.05)
    raise AssertionError(f"no {kind} event")


async def start_task(client, task_queue, workspace, model, **overrides):
    inp = TaskInput(task="write a", workspace=str(workspace), model=model,
                    approval_mode="confirm_writes", enable_reflection=False, **overrides)
    return await start(client, task_queue, inp)


async def test_golden_an_approved_write_runs_is_reviewed_and_its_decision_leaves(
        client, settings, scripted_llm, workspace, task_queue):
    model = unique_scenario(scripted_llm, {**scenario(), "quality_review": [PASS]})
    async with build_worker(client, settings, task_queue):
        handle = await start_task(client, task_queue, workspace, model,
                                  enable_quality_review=True)
        pending = await wait_for(handle, "approval_required")
        assert pending["tool"] == "write_file"  # the read before it needed no approval
        decision = ApprovalDecision(call_id=pending["call_id"], approved=True, comment="ok")
        answer = await handle.execute_update(AgentTaskWorkflow.decide_approval, decision)
        assert answer == "approved"
        await wait_for(handle, "approval_decided")
        # Read by its call, the decision left the state: sent again, it is refused.
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(AgentTaskWorkflow.decide_approval, decision)
        assert "no pending approval" in str(refused.value.cause)
        result = await result_of(handle)
        history = await handle.fetch_history()
    if os.environ.get("REFLOOP_RECORD_HISTORIES"):  # `make histories`
        (HISTORIES / "agent_task_approved_and_reviewed.json").write_text(dump_history(history))
    assert result.status == "completed" and (workspace / "a.txt").read_text() == "a"
    assert events_of(result, "approval_decided")[0]["approved"] is True
    assert [r.file_path for r in result.quality_reviews] == ["a.txt"]


async def test_golden_approval_wait_is_in_the_row(client, settings, scripted_llm, workspace,
                                                  task_queue, tmp_path):
    """The row says `waiting_approval` while the call waits and `running` again once
    decided. Its history is golden (`make histories`)."""
    model = unique_scenario(scripted_llm, scenario())
    store = store_for(settings.effective_database_url)
    async with build_worker(client, settings, task_queue):
        handle = await start_task(client, task_queue, workspace, model)
        pending = await wait_for(handle, "approval_required")
        for _ in range(200):
            if (row := store.get_task(handle.id)) is not None and \
                    row.status == "waiting_approval":
                break
            await asyncio.sleep(0.05)
        assert row is not None and row.status == "waiting_approval"
        await handle.execute_update(
            AgentTaskWorkflow.decide_approval,
            ApprovalDecision(call_id=pending["call_id"], approved=True))
        result = await result_of(handle)
        history = await handle.fetch_history()
    assert result.status == "completed" and store.get_task(handle.id).status == "completed"
    saved = tmp_path / "run.json"
    saved.write_text(dump_history(history))
    assert await replay_files([saved]) == {}
    if os.environ.get("REFLOOP_RECORD_HISTORIES"):  # `make histories`
        (HISTORIES / "agent_task_approval_wait_in_row.json").write_text(dump_history(history))


async def test_rejected_write_is_fed_back_as_denied(client, settings, scripted_llm, workspace,
                                                    task_queue):
    model = unique_scenario(scripted_llm, scenario())
    async with build_worker(client, settings, task_queue):
        handle = await start_task(client, task_queue, workspace, model)
        pending = await wait_for(handle, "approval_required")
        await handle.execute_update(
            AgentTaskWorkflow.decide_approval,
            ApprovalDecision(call_id=pending["call_id"], approved=False, comment="not now"))
        # Deciding twice, or an unknown call, is refused by the validator.
        for call_id in (pending["call_id"], "99.9"):
            with pytest.raises((WorkflowUpdateFailedError, RPCError)):
                await handle.execute_update(
                    AgentTaskWorkflow.decide_approval,
                    ApprovalDecision(call_id=call_id, approved=True))
        result = await result_of(handle)
    # The only planned edit was denied: nothing was changed, so the task is not completed.
    assert result.status == "incomplete" and not (workspace / "a.txt").exists()
    denied = [r for r in events_of(result, "tool_result") if r["tool"] == "write_file"][0]
    assert denied["ok"] is False and "rejected this call: not now" in denied["error"]
    fed_back = str(scripted_llm.requests(model=model, purpose="act")[2]["body"]["messages"])
    assert "E_DENIED" in fed_back


async def test_golden_no_decision_in_time_ends_the_task_incomplete_naming_the_call(
        client, settings, scripted_llm, workspace, task_queue):
    """An unanswered approval is no rejection: nothing runs after it, the model is not asked
    again, and the task ends incomplete (never completed), naming the call. Its history is
    golden (`make histories`)."""
    model = unique_scenario(scripted_llm, scenario())
    async with build_worker(client, settings, task_queue):
        handle = await start_task(client, task_queue, workspace, model, approval_timeout_s=1)
        result = await result_of(handle)
    assert result.status == "incomplete" and result.stop_reason == "approval_timeout"
    assert result.missing == ["no decision on call 2.0 (write_file a.txt) within 1 s"]
    expired = events_of(result, "approval_expired")[0]
    assert expired == {"call_id": "2.0", "tool": "write_file", "waited": "1 s"}
    assert not events_of(result, "approval_decided") and not events_of(result, "summary")
    assert not (workspace / "a.txt").exists()
    assert len(scripted_llm.requests(model=model, purpose="act")) == 2  # not asked again
    row = store_for(settings.effective_database_url).get_task(handle.id)
    assert row.status == "incomplete" and "write_file a.txt" in row.error
    # The Web UI names the wait (it was an unlabelled timer).
    history = await handle.fetch_history()
    timers = [json.loads(e.user_metadata.summary.data) for e in history.events
              if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED]
    assert timers == ["waiting for approval: write_file a.txt"]
    if os.environ.get("REFLOOP_RECORD_HISTORIES"):  # `make histories`
        (HISTORIES / "agent_task_approval_unanswered.json").write_text(dump_history(history))


def test_the_default_wait_is_days_and_the_operator_sets_it():
    from refloop.settings import Settings

    assert TaskInput(task="t", workspace="/w").approval_timeout_s == 3 * 24 * 3600
    settings = Settings(_env_file=None, refloop_approval_timeout_s=7200)
    assert settings.task_input(task="t", workspace="/w").approval_timeout_s == 7200
    assert settings.task_input(task="t", workspace="/w",
                               approval_timeout_s=5).approval_timeout_s == 5
    assert settings.task_input(task="t", workspace="/w",
                               approval_timeout_s=None).approval_timeout_s == 7200


async def test_golden_approved_with_edited_arguments_runs_them_and_says_so(
        client, settings, scripted_llm, workspace, task_queue):
    """The person's arguments run, checked like the model's own: an invalid edit is refused
    with the reason and the call still waits; the event keeps both; the model is told. Its
    history is golden (`make histories`)."""
    model = unique_scenario(scripted_llm, scenario())
    async with build_worker(client, settings, task_queue):
        handle = await start_task(client, task_queue, workspace, model)
        pending = await wait_for(handle, "approval_required")
        key = pending["call_id"]
        asked = next(e for e in await handle.query(AgentTaskWorkflow.events, 0)
                     if e.type == "approval_required")
        waits = datetime.fromisoformat(pending["expires_at"]) - datetime.fromisoformat(asked.ts)
        assert waits == timedelta(days=3)  # the default: a person's answer may take days
        refusals = {
            "invalid arguments for write_file: content: Field required": {"path": "b.txt"},
            "invalid arguments for write_file: content: Input should be a valid string":
                {"path": "b.txt", "content": 3},
            "invalid arguments for write_file: unknown argument(s) contnet; the tool takes "
            "path, content": {"path": "b.txt", "content": "x", "contnet": "x"},
        }
        for reason, arguments in refusals.items():
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await handle.execute_update(AgentTaskWorkflow.decide_approval, ApprovalDecision(
                    call_id=key, approved=True, arguments=arguments))
            assert refused.value.cause.message == reason
            assert refused.value.cause.type == "InvalidApprovalEdit"
        with pytest.raises(WorkflowUpdateFailedError) as refused:  # a rejection runs nothing
            await handle.execute_update(AgentTaskWorkflow.decide_approval, ApprovalDecision(
                call_id=key, approved=False, arguments={"path": "b.txt", "content": "x"}))
        assert "go with an approval" in refused.value.cause.message
        edited = {"path": "b.txt", "content": "edited by a person"}
        assert await handle.execute_update(AgentTaskWorkflow.decide_approval, ApprovalDecision(
            call_id=key, approved=True, arguments=edited)) == "approved"
        result = await result_of(handle)
        history = await handle.fetch_history()
    if os.environ.get("REFLOOP_RECORD_HISTORIES"):  # `make histories`
        (HISTORIES / "agent_task_approved_with_edited_arguments.json").write_text(
            dump_history(history))
    assert result.status == "completed", result.answer
    assert (workspace / "b.txt").read_text() == "edited by a person"
    assert not (workspace / "a.txt").exists()
    decided = events_of(result, "approval_decided")[0]
    assert decided["edited"] is True and decided["arguments"] == edited
    assert decided["original_arguments"] == {"path": "a.txt", "content": "a"}
    ran = [r for r in events_of(result, "tool_result") if r["tool"] == "write_file"][0]
    assert ran["ok"] and ran["output"].startswith("Note: the user edited this call's")
    told = str(scripted_llm.requests(model=model, purpose="act")[2]["body"]["messages"])
    assert "the user edited this call" in told and "edited by a person" in told


async def test_an_approval_without_an_edit_reads_as_before(client, settings, scripted_llm,
                                                           workspace, task_queue):
    """The model's own arguments sent back unchanged are no edit."""
    model = unique_scenario(scripted_llm, scenario())
    async with build_worker(client, settings, task_queue):
        handle = await start_task(client, task_queue, workspace, model)
        pending = await wait_for(handle, "approval_required")
        await handle.execute_update(AgentTaskWorkflow.decide_approval, ApprovalDecision(
            call_id=pending["call_id"], approved=True, arguments=pending["args"]))
        result = await result_of(handle)
    assert events_of(result, "approval_decided") == [
        {"call_id": pending["call_id"], "approved": True, "comment": None}]
    assert (workspace / "a.txt").read_text() == "a"


async def test_cancel_records_the_run_as_cancelled(client, settings, scripted_llm, workspace,
                                                   task_queue):
    model = unique_scenario(scripted_llm, scenario())
    async with build_worker(client, settings, task_queue):
        handle = await start_task(client, task_queue, workspace, model)
        await wait_for(handle, "approval_required")
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await handle.result()
    row = store_for(settings.effective_database_url).get_task(handle.id)
    assert row.status == "cancelled"


def test_approval_modes():
    from refloop.contract.messages import ToolCall
    from refloop.contract.tool_catalog import tool_properties

    def needs(mode, name, **args):
        return needs_approval(mode, ToolCall(id="x", name=name, arguments=args),
                              tool_properties(name))

    assert not needs("auto", "write_file")
    assert needs("confirm_writes", "write_file")
    assert needs("confirm_writes", "run_cmd", command="ls")
    assert needs("confirm_writes", "str_replace_based_edit_tool", command="insert")
    assert not needs("confirm_writes", "str_replace_based_edit_tool", command="view")
    assert needs("confirm_writes", "json_edit_tool", operation="set")
    assert not needs("confirm_writes", "json_edit_tool", operation="view")
    assert not needs("confirm_writes", "read_file", path="a")
    assert needs("confirm_all", "read_file", path="a")
    assert needs("confirm_all", "str_replace_based_edit_tool", command="view")
    assert not needs("confirm_all", "complete_step", step=1)  # a control tool
    # A tool nobody registered waits only where every call does.
    assert not needs("confirm_writes", "teleport") and needs("confirm_all", "teleport")
