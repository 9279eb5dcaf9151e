"""Shared helpers for workflow tests: scenarios, running a task, reading failures."""

from __future__ import annotations

import asyncio
import inspect
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle, WorkflowHistory
from temporalio.exceptions import ApplicationError

from refloop.contract.task import TaskInput, TaskResult
from refloop.settings import Settings
from refloop.worker.main import build_worker
from refloop.worker.replay import dump_history
from refloop.workflows.agent import AgentTaskWorkflow

HISTORIES = Path(__file__).parent.parent / "histories"
CODING = {"json": {"intent": "CODING_TASK", "confidence": 0.9, "reason": "edit"}}
CHAT = {"json": {"intent": "GENERAL_CHAT", "confidence": 0.95, "reason": "greeting"}}
SUMMARY = {"content": "summary of the run"}


def plan_of(*tools: str) -> dict[str, Any]:
    return {
        "json": {
            "task_type": "coding",
            "steps": [{"goal": f"use {tool}", "tool": tool} for tool in tools],
        }
    }


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def final(text: str = "done") -> dict[str, Any]:
    return {"content": text}


async def run_task(
    client: Client,
    settings: Settings,
    task_queue: str,
    model: str,
    workspace: Path,
    task: str = "do the task",
    record_as: str | None = None,
    **overrides: Any,
) -> TaskResult:
    """Run one AgentTaskWorkflow on a fresh worker; a failed run returns its result too.

    Completeness reflection is off unless a test asks for it: its own tests script it."""
    overrides.setdefault("enable_reflection", False)
    inp = TaskInput(task=task, workspace=str(workspace), model=model, **overrides)
    result, history = await run_with_history(client, settings, task_queue, inp)
    if record_as:
        keep_golden(record_as, history)
    return result


def keep_golden(name: str, history: WorkflowHistory) -> None:
    """Save a run's history as the golden history `name` (`make histories` only)."""
    if os.environ.get("REFLOOP_RECORD_HISTORIES"):
        HISTORIES.mkdir(exist_ok=True)
        (HISTORIES / f"{name}.json").write_text(dump_history(history))


async def run_with_history(client: Client, settings: Settings, task_queue: str,
                           inp: TaskInput) -> tuple[TaskResult, WorkflowHistory]:
    async with build_worker(client, settings, task_queue):
        handle = await start(client, task_queue, inp)
        result = await result_of(handle)
        return result, await handle.fetch_history()


async def start(client: Client, task_queue: str, inp: TaskInput) -> WorkflowHandle:
    return await client.start_workflow(
        AgentTaskWorkflow.run, inp, id=f"test-{uuid.uuid4().hex[:10]}", task_queue=task_queue
    )


async def result_of(handle: WorkflowHandle) -> TaskResult:
    try:
        return await handle.result()
    except WorkflowFailureError as failure:
        cause = failure.cause
        assert isinstance(cause, ApplicationError), f"unexpected failure: {failure!r}"
        return TaskResult.model_validate(cause.details[0])


# Long enough to kill a worker in; a retried call waits again.
SLOW_MODEL_MS = 3000


def edit_and_wait_twice(workspace: Path) -> dict[str, Any]:
    """Two journaled edits, each followed by a read and then a 3 s model call a crash test
    can kill a worker in (tool calls of iterations 2 and 4 come just before). The workspace
    ends with notes.md holding exactly three lines when each edit ran once. Load it with
    `repeat=True`: a model call cut off by a crash, asked again, gets the same answer."""
    (workspace / "notes.md").write_text("line one\n")
    return {
        "intent": [CODING],
        "plan": [plan_of("str_replace_based_edit_tool", "read_file")],
        "act": [
            call("str_replace_based_edit_tool", command="insert", path="notes.md",
                 insert_line=1, new_str="line two"),
            call("read_file", path="notes.md"),
            {**call("str_replace_based_edit_tool", command="insert", path="notes.md",
                    insert_line=2, new_str="line three"), "delay_ms": SLOW_MODEL_MS},
            call("read_file", path="notes.md"),
            {**final("inserted twice and read twice"), "delay_ms": SLOW_MODEL_MS},
        ],
        "summary": [SUMMARY],
    }


def one_slow_command(workspace: Path, script: str) -> dict[str, Any]:
    """One `sh slow.sh` call running `script`, a window for killing or stopping a worker."""
    (workspace / "slow.sh").write_text(script)
    return {
        "intent": [CODING], "plan": [plan_of("run_cmd")],
        "act": [call("run_cmd", command="sh slow.sh"), final("slept")],
        "summary": [SUMMARY],
    }


def event_types(result: TaskResult) -> list[str]:
    return [event.type for event in result.events]


def events_of(result: TaskResult, kind: str) -> list[dict[str, Any]]:
    return [event.data for event in result.events if event.type == kind]


def activity_starts(history: WorkflowHistory, activity_type: str) -> list[tuple[int, Any]]:
    """(n, event) for each started attempt of the n-th (from 0) scheduled `activity_type`."""
    scheduled = [e.event_id for e in history.events
                 if e.HasField("activity_task_scheduled_event_attributes")
                 and e.activity_task_scheduled_event_attributes.activity_type.name
                 == activity_type]
    return [(scheduled.index(e.activity_task_started_event_attributes.scheduled_event_id), e)
            for e in history.events if e.HasField("activity_task_started_event_attributes")
            and e.activity_task_started_event_attributes.scheduled_event_id in scheduled]


async def wait_until(condition: Callable[[], bool | Awaitable[bool]], what: str,
                     timeout_s: float = 60.0) -> None:
    """Poll `condition` (maybe async) until it holds: a crash test kills or stops a worker
    on the run's real state, not after a guessed sleep that a loaded machine outlasts."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        held = condition()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s")


async def running(handle: WorkflowHandle, activity_type: str) -> bool:
    """Whether a worker has started an `activity_type` of this workflow, not yet finished."""
    pending = (await handle.describe()).raw_description.pending_activities
    return any(a.activity_type.name == activity_type
               and a.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
               for a in pending)
