"""Rewind and fork, as `refloop rewind` / `refloop fork` and `POST /tasks/{id}/rewind` /
`/fork` do them: one core each, so the CLI and the API refuse and succeed alike.

- Rewind: an update of the running task (`rewind`), which validates the step and, at its
  next safe point, puts back its workspace, conversation and progress together, then
  answers; refused or failed, nothing changed. The cost of the calls it took back stays in
  the ledger, marked rewound. The update has an id of its own: when Temporal does not
  answer, it is asked again with that id, so the answer is the rewind's, never a guess.
- Fork: a new task in a new workspace, restored from a step's checkpoint, carrying the
  original's plan, progress and conversation up to that step (`refloop.checkpoints.fork`
  decides what); linked both ways (the fork's input, memo and `forked_from` event; the
  original's `forked` event while it runs, and its task view).

What is carried and cut is decided by plain functions; this module reads, writes and
refuses. Errors are `BranchRefused` with an HTTP status the API answers with.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from pydantic import TypeAdapter, ValidationError
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from refloop.checkpoints.fork import carried_to, forked_conversation
from refloop.checkpoints.rewind import CannotRewind, payload_fields
from refloop.contract.checkpoints import (
    ForkOrigin,
    ForkTaken,
    RewindRequest,
)
from refloop.contract.hosts import HostRefused, UnknownHost, check_host
from refloop.contract.messages import ChatMessage
from refloop.contract.task import RecordTaskInput, TaskInput
from refloop.contract.visibility import start_metadata
from refloop.runtime.workspaces import WorkspaceError, host_workspace, workspace_roots
from refloop.settings import Settings
from refloop.store.db import Store
from refloop.store.hosts import list_hosts
from refloop.workflows.agent import AgentTaskWorkflow

CONVERSATION = TypeAdapter(list[ChatMessage])
# How long a rewind is asked again (the same update) while Temporal does not answer
REWIND_RETRY_S = 30.0
ONLY_RUNNING = ("only a running task can be rewound; fork it from that step instead "
                "(`refloop fork TASK --at-step N`, POST /tasks/{id}/fork): a new task goes "
                "on from there and this one stays as it ended")


class BranchRefused(Exception):
    """A rewind or fork that cannot be done, said for a person; `status` for the API."""

    status = 409

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class TaskUnknown(BranchRefused):
    status = 404


class BadStep(BranchRefused):
    status = 422  # no such step, or no checkpoint there


class BadWorkspace(BranchRefused):
    status = 422


class TemporalSilent(BranchRefused):
    status = 503


@dataclass(frozen=True)
class Rewound:
    task_id: str
    step: int
    checkpoint_id: str
    call_id: str  # the call after which the checkpoint was taken
    run_id: str  # the run, which goes on (a rewind starts none)
    edits_taken_back: int
    rewound_tokens: int  # the cost of the calls taken back, kept marked rewound


@dataclass(frozen=True)
class Forked:
    task_id: str
    forked_from: str
    step: int
    checkpoint_id: str
    workspace: str
    host: str | None


def _refused(task_id: str, err: RPCError) -> BranchRefused:
    if err.status == RPCStatusCode.NOT_FOUND:
        return TaskUnknown(f"task {task_id} not found")
    if err.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
        return TemporalSilent(f"Temporal did not answer: {err.message}")
    return BranchRefused(err.message)


async def _latest_run(client: Client, task_id: str) -> tuple[str, WorkflowExecutionStatus,
                                                              list[HistoryEvent]]:
    handle = client.get_workflow_handle(task_id)
    try:
        described = await handle.describe()
        if described.workflow_type != "AgentTaskWorkflow":
            raise TaskUnknown(f"task {task_id} is not an agent task")
        history = await client.get_workflow_handle(
            task_id, run_id=described.run_id).fetch_history()
    except RPCError as err:
        raise _refused(task_id, err) from None
    status = described.status or WorkflowExecutionStatus.RUNNING
    events = await decoded_events(client, list(history.events))
    return described.run_id or "", status, events


async def decoded_events(client: Client, events: list[HistoryEvent]) -> list[HistoryEvent]:
    """The events with the client's payload codec undone (if it has one) on the payloads
    rewind and fork read; the payload converter reads them after."""
    codec = client.data_converter.payload_codec
    if codec is None:
        return events
    for event in events:
        for payloads in payload_fields(event):
            if payloads.payloads:
                decoded = await codec.decode(list(payloads.payloads))
                del payloads.payloads[:]
                payloads.payloads.extend(decoded)
    return events


def _rewind_refused(task_id: str, err: WorkflowUpdateFailedError) -> BranchRefused:
    cause = err.cause
    message = cause.message if isinstance(cause, ApplicationError) else str(cause or err)
    if "no step" in message or "no workspace checkpoint" in message:
        return BadStep(f"task {task_id} not rewound: {message}")
    return BranchRefused(f"task {task_id} not rewound: {message}")


async def rewind(client: Client, task_id: str, step: int) -> Rewound:
    """Put a running task back to its `step`th checkpoint (of its current run). Waits for
    the task's next safe point (its current tool call ends first)."""
    run_id, status, _ = await _latest_run(client, task_id)
    if status != WorkflowExecutionStatus.RUNNING:
        raise BranchRefused(f"task {task_id} has ended ({status.name.lower()}): "
                            + ONLY_RUNNING)
    handle = client.get_workflow_handle(task_id, run_id=run_id)
    update_id = f"rewind-{uuid.uuid4()}"
    deadline = time.monotonic() + REWIND_RETRY_S
    while True:
        try:
            done = await handle.execute_update(AgentTaskWorkflow.rewind,
                                               RewindRequest(step=step), id=update_id)
            break
        except WorkflowUpdateFailedError as err:
            raise _rewind_refused(task_id, err) from None
        except RPCError as err:
            silent = err.status in (RPCStatusCode.UNAVAILABLE,
                                    RPCStatusCode.DEADLINE_EXCEEDED)
            if not silent or time.monotonic() > deadline:
                if silent:  # accepted or not: the task's events say which
                    raise TemporalSilent(
                        f"Temporal did not answer ({err.message}); the rewind may still "
                        f"happen: `refloop show {task_id}` says whether the task was "
                        "rewound") from None
                raise _refused(task_id, err) from None
            await asyncio.sleep(1.0)  # the same update id: never a second rewind
    return Rewound(task_id, done.step, done.checkpoint_id, done.call_id, run_id,
                   done.calls_taken_back, done.rewound_tokens)


def _started_input(client: Client, events: list[HistoryEvent]) -> TaskInput:
    """The task's input, through the client's data converter (codec undone before)."""
    started = events[0].workflow_execution_started_event_attributes
    read = client.data_converter.payload_converter.from_payloads(
        list(started.input.payloads), [TaskInput])
    return TaskInput.model_validate(read[0])


def fork_workspace(raw: str | None, original: TaskInput, fork_id: str, store: Store,
                   settings: Settings) -> str:
    """The fork's directory: `raw`, or beside the original's (`<it>-fork-<id>`); on the
    original's host, under its roots, and not a directory holding files (the host checks
    that again before restoring)."""
    path = raw if raw is not None else f"{original.workspace.rstrip('/')}-fork-{fork_id[-8:]}"
    try:
        if original.host is not None:
            path = host_workspace(path, original.host)
            check_host(original.host, path, list_hosts(store))
            return path
        if not os.path.isabs(path):
            raise WorkspaceError(f"{path}: give an absolute path")
        target = Path(os.path.normpath(path))
        roots = workspace_roots(settings)
        if not any(target == r or r in target.parents for r in roots):
            raise WorkspaceError(f"{target} is under none of the workspace roots "
                                 f"({', '.join(map(str, roots)) or 'none'})")
        if target.exists() and (not target.is_dir() or any(target.iterdir())):
            raise WorkspaceError(f"{target} already holds files: a fork goes to a new or "
                                 "empty directory")
        return str(target)
    except (WorkspaceError, HostRefused, UnknownHost) as err:
        raise BadWorkspace(f"--workspace: {err}") from None


async def fork(client: Client, store: Store, settings: Settings, task_id: str, step: int,
               instruction: str | None = None, workspace: str | None = None) -> Forked:
    """Start a new task from step `step` of `task_id` (running or ended)."""
    _, status, events = await _latest_run(client, task_id)
    try:
        carried = carried_to(events, step)
        original = _started_input(client, events)
    except CannotRewind as err:
        raise BadStep(f"task {task_id} not forked: {err}") from None
    except (ValidationError, ValueError, IndexError, RuntimeError) as err:
        raise BranchRefused(f"task {task_id} not forked: its start cannot be read "
                            f"({err})") from None
    fork_id = f"task-{uuid.uuid4().hex[:12]}"
    path = await asyncio.to_thread(fork_workspace, workspace, original, fork_id, store,
                                   settings)
    ref = None
    if carried.conversation_ref is not None:
        def carry() -> str:
            stored = CONVERSATION.validate_json(store.get_blob(carried.conversation_ref))
            messages = forked_conversation(stored, carried.turns, original.workspace, path,
                                           instruction)
            return store.put_blob(CONVERSATION.dump_json(messages).decode())
        ref = await asyncio.to_thread(carry)
    origin = ForkOrigin(task_id=task_id, step=carried.checkpoint.step,
                        checkpoint_id=carried.checkpoint.checkpoint_id, conversation_ref=ref,
                        plan=carried.plan, completed_steps=carried.completed_steps,
                        changes=carried.checkpoint.step, instruction=instruction)
    text = original.task if not instruction else f"{original.task}\n\n{instruction}"
    inp = original.model_copy(update={
        "task": text, "task_id": fork_id, "workspace": path, "session_id": None,
        "resume_state": None, "is_supplement": False, "preset_plan": None, "fork": origin})
    inp = TaskInput.model_validate(inp.model_dump())  # checked as any task's input
    await asyncio.to_thread(store.record_task, RecordTaskInput(
        task_id=fork_id, workflow_id=fork_id, status="queued",
        input=inp.model_dump(mode="json")))
    try:
        await client.start_workflow(
            AgentTaskWorkflow.run, inp, id=fork_id, task_queue=settings.task_queue,
            memo={"forked_from": {"task_id": task_id, "step": origin.step}},
            **start_metadata(f"fork of {task_id} at step {origin.step}: {text}", path))
    except RPCError as err:
        await asyncio.to_thread(store.record_task, RecordTaskInput(
            task_id=fork_id, workflow_id=fork_id, status="failed",
            error=f"workflow did not start: {err.message}"))
        raise _refused(fork_id, err) from None
    if status == WorkflowExecutionStatus.RUNNING:  # a closed run takes no event
        # it may end meanwhile: the link is then in the fork and the task view
        with contextlib.suppress(RPCError):
            await client.get_workflow_handle(task_id).signal(
                AgentTaskWorkflow.fork_taken, ForkTaken(task_id=fork_id, step=origin.step))
    return Forked(fork_id, task_id, origin.step, origin.checkpoint_id, path, original.host)
