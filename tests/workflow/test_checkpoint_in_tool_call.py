"""The checkpoint after a built-in tool call, taken by the call's own activity on the real
dev server: no checkpoint activity and no workflow task of its own, the call's event and the
task's list name it, and a rewind or a fork finds it in the history. One that fails there
costs the call nothing: it is taken again, apart, before the next call. An attempt lost
after its checkpoint is retried: the edit applied once, the same checkpoint listed once."""

from __future__ import annotations

from typing import Any

from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory

from refloop.activities.checkpoint_activities import CheckpointActivities
from refloop.checkpoints.rewind import run_checkpoints
from refloop.contract import activity_calls
from refloop.contract.checkpoints import CheckpointInput, CheckpointResult
from refloop.contract.task import TaskInput
from refloop.store.db import store_for
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import (
    CODING,
    SUMMARY,
    call,
    events_of,
    final,
    plan_of,
    run_with_history,
)

CHECKPOINT = activity_calls.CHECKPOINT_WORKSPACE.name
# A step of one model call and one write: the model call's 3 events, the tool call's 3,
# and a workflow task (3 events) after each
EVENTS_PER_WRITE_STEP = 12


def scheduled(history: WorkflowHistory) -> list[str]:
    return [e.activity_task_scheduled_event_attributes.activity_type.name
            for e in history.events if e.HasField("activity_task_scheduled_event_attributes")]


def steps(events: list[HistoryEvent]) -> list[list[HistoryEvent]]:
    """The history cut at each model turn: each step from its act to the next one."""
    acts = [n for n, e in enumerate(events)
            if e.HasField("activity_task_scheduled_event_attributes")
            and e.activity_task_scheduled_event_attributes.activity_type.name
            == activity_calls.ACT.name]
    return [events[start:end] for start, end in zip(acts, acts[1:], strict=False)]


def one_write(then: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [call("write_file", path="a.txt", content="one\n"), *(then or []),
                call("complete_step", step=1, summary="ok"), final("ok")],
        "summary": [SUMMARY],
    }


async def test_a_write_is_checkpointed_by_its_own_call(client, settings, scripted_llm,
                                                       workspace, task_queue):
    model = unique_scenario(scripted_llm, one_write())
    result, history = await run_with_history(client, settings, task_queue, TaskInput(
        task="write a", workspace=str(workspace), model=model, enable_reflection=False))
    assert result.status == "completed"

    assert CHECKPOINT not in scheduled(history)  # no activity of its own
    write = [r for r in events_of(result, "tool_result") if r["tool"] == "write_file"]
    assert len(write) == 1 and write[0]["ok"] and write[0]["checkpoint"]
    listed = store_for(settings.effective_database_url).checkpoints_of(result.task_id)
    assert [row.checkpoint_id for row in listed] == [write[0]["checkpoint"]]
    # Rewind and fork read it from the history: the same checkpoint, after the same call
    found = run_checkpoints(list(history.events))
    assert [(c.call_id, c.checkpoint_id) for c in found] == [
        (listed[0].call_id, write[0]["checkpoint"])]
    # The write's step: one model call, one tool call, no third round trip
    write_step = steps(list(history.events))[0]
    assert len(write_step) == EVENTS_PER_WRITE_STEP, [
        e.WhichOneof("attributes") for e in write_step]


async def test_a_checkpoint_that_failed_in_the_call_is_taken_again_before_the_next(
        client, settings, scripted_llm, workspace, task_queue, monkeypatch):
    taken: list[str | None] = []  # the checkpoints, in order; None: failed
    checkpoint = CheckpointActivities._checkpoint

    def store_down_once(self: CheckpointActivities, inp: CheckpointInput,
                        deadline: float | None = None) -> CheckpointResult:
        if not taken:  # the write's, in its own call
            taken.append(None)
            raise RuntimeError("INSERT INTO checkpoint_objects VALUES ('secret bytes')")
        done = checkpoint(self, inp, deadline)
        taken.append(done.checkpoint_id)
        return done

    monkeypatch.setattr(CheckpointActivities, "_checkpoint", store_down_once)
    model = unique_scenario(scripted_llm, one_write([call("read_file", path="a.txt")]))
    result, history = await run_with_history(client, settings, task_queue, TaskInput(
        task="write a", workspace=str(workspace), model=model, enable_reflection=False))
    assert result.status == "completed"

    write = [r for r in events_of(result, "tool_result") if r["tool"] == "write_file"][0]
    assert write["ok"] and "checkpoint" not in write  # the edit stands
    assert write["checkpoint_error"].startswith("CheckpointStoreFailed: ")
    assert "secret" not in write["checkpoint_error"]
    assert (workspace / "a.txt").read_text() == "one\n"
    # Taken again with its own activity, before the read: once, for the write's call
    names = scheduled(history)
    assert names.count(CHECKPOINT) == 1
    assert names.index(CHECKPOINT) < names.index(activity_calls.run_tool("read_file").name)
    retaken = events_of(result, "checkpoint_retaken")
    assert len(retaken) == 1 and retaken[0]["checkpoint"] == taken[-1]
    listed = store_for(settings.effective_database_url).checkpoints_of(result.task_id)
    assert [(row.call_id, row.checkpoint_id) for row in listed] == [
        (retaken[0]["call"], taken[-1])]
    assert [(c.call_id, c.checkpoint_id) for c in run_checkpoints(list(history.events))] == [
        (retaken[0]["call"], taken[-1])]



async def test_an_attempt_lost_after_its_checkpoint_is_retried_and_the_edit_applied_once(
        client, settings, scripted_llm, workspace, task_queue, monkeypatch):
    """The worker lost between the checkpoint and the result: the edit's second attempt
    finds it in the journal (applied once) and checkpoints the same workspace again."""
    (workspace / "notes.md").write_text("line one\n")
    after_call = CheckpointActivities.after_call
    attempts: list[str | None] = []

    async def lost_once(self: CheckpointActivities, *args: Any, **kwargs: Any) -> Any:
        taken = await after_call(self, *args, **kwargs)
        attempts.append(taken.checkpoint_id)
        if len(attempts) == 1:
            raise RuntimeError("the worker went away before it reported")
        return taken

    monkeypatch.setattr(CheckpointActivities, "after_call", lost_once)
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("str_replace_based_edit_tool")],
        "act": [call("str_replace_based_edit_tool", command="insert", path="notes.md",
                     insert_line=1, new_str="line two"),
                call("complete_step", step=1, summary="ok"), final("ok")],
        "summary": [SUMMARY],
    })
    result, history = await run_with_history(client, settings, task_queue, TaskInput(
        task="insert a line", workspace=str(workspace), model=model, enable_reflection=False))
    assert result.status == "completed"

    assert (workspace / "notes.md").read_text() == "line one\nline two\n"  # once
    assert len(attempts) == 2 and attempts[0] == attempts[1]  # the same workspace
    edit = [r for r in events_of(result, "tool_result") if r["tool"] != "complete_step"][0]
    assert edit["ok"] and edit["checkpoint"] == attempts[0]
    listed = store_for(settings.effective_database_url).checkpoints_of(result.task_id)
    assert [row.checkpoint_id for row in listed] == [attempts[0]]
    assert CHECKPOINT not in scheduled(history)
    assert [c.checkpoint_id for c in run_checkpoints(list(history.events))] == [attempts[0]]
