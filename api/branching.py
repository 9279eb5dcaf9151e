"""Rewind and fork, as `refloop rewind` / `refloop fork` and `POST /tasks/{id}/rewind` /
`/fork` do them: one core each, so the CLI and the API refuse and succeed alike.

- Rewind: a running task is told the checkpoint (a signal), then its run is reset to just
  after it (Temporal's reset, signals reapplied): the reset run restores its workspace and
  goes on from there. The old run's history is complete once reset, so the cost of the
  calls it took out is then exact: sent to the new run, kept in its ledger marked rewound.
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
import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from pydantic import TypeAdapter, ValidationError
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import ResetReapplyType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from refloop.checkpoints.fork import carried_to, forked_conversation, usage_after
from refloop.checkpoints.rewind import CannotRewind, choose, reset_point, run_checkpoints
from refloop.contract.checkpoints import (
    ForkOrigin,
    ForkTaken,
    RewindRequest,
    RewoundCost,
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
    run_id: str
    rewound_tokens: int  # the cost the reset took out of the run, kept marked rewound


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
    return described.run_id or "", status, list(history.events)


async def rewind(client: Client, task_id: str, step: int) -> Rewound:
    """Put a running task back to its `step`th checkpoint (of its current run)."""
    run_id, status, events = await _latest_run(client, task_id)
    if status != WorkflowExecutionStatus.RUNNING:
        raise BranchRefused(f"task {task_id} has ended ({status.name.lower()}): "
                            + ONLY_RUNNING)
    try:
        chosen = choose(run_checkpoints(events), step)
        point = reset_point(events, chosen)
    except CannotRewind as err:
        raise BadStep(f"task {task_id} not rewound: {err}") from None
    try:
        await client.get_workflow_handle(task_id, run_id=run_id).signal(
            AgentTaskWorkflow.rewind_workspace,
            RewindRequest(checkpoint_id=chosen.checkpoint_id, step=chosen.step))
        reset = await client.workflow_service.reset_workflow_execution(
            ResetWorkflowExecutionRequest(
                namespace=client.namespace,
                workflow_execution=WorkflowExecution(workflow_id=task_id, run_id=run_id),
                reason=f"refloop rewind to step {chosen.step} (after call {chosen.call_id})",
                workflow_task_finish_event_id=point, request_id=str(uuid.uuid4()),
                reset_reapply_type=ResetReapplyType.RESET_REAPPLY_TYPE_SIGNAL))
    except RPCError as err:
        raise _refused(task_id, err) from None
    tokens = await _keep_rewound_cost(client, task_id, run_id, reset.run_id, point,
                                      chosen.step)
    return Rewound(task_id, chosen.step, chosen.checkpoint_id, reset.run_id, tokens)


async def _keep_rewound_cost(client: Client, task_id: str, old_run: str, new_run: str,
                             point: int, step: int) -> int:
    """The old run's cost after the reset point, told to the new run (the rewind stands
    whatever happens here: a lost figure is not a reason to fail it)."""
    try:
        history = await client.get_workflow_handle(task_id, run_id=old_run).fetch_history()
        usage, by_model = usage_after(list(history.events), point)
        if usage.calls or usage.total_tokens:
            await client.get_workflow_handle(task_id, run_id=new_run).signal(
                AgentTaskWorkflow.rewound_cost,
                RewoundCost(step=step, usage=usage, usage_by_model=by_model))
    except RPCError:
        return 0
    return usage.total_tokens


def _started_input(events: list[HistoryEvent]) -> TaskInput:
    started = events[0].workflow_execution_started_event_attributes
    return TaskInput.model_validate(json.loads(started.input.payloads[0].data))


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
        original = _started_input(events)
    except CannotRewind as err:
        raise BadStep(f"task {task_id} not forked: {err}") from None
    except (ValidationError, ValueError, IndexError) as err:
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
