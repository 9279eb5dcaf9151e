"""Reviewing what an agent task did: the changes in its workspace (diffs between its own
checkpoints), the checkpoints its current run can be rewound or forked to (numbered as
rewind and fork number them), and a rerun with the same input.

Read-only but the rerun. A checkpoint id a client sends is only looked up among the ones
the task's own record lists; nothing is read by a client's id alone."""

from __future__ import annotations

import asyncio
import re
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request, status
from pydantic import BaseModel, ValidationError
from temporalio.service import RPCError

from refloop.api import branching
from refloop.api.deps import ClientDep, SettingsDep, StoreDep
from refloop.api.routes.hosts import recheck_host
from refloop.api.routes.tasks import TaskId, not_found, task_row
from refloop.api.schemas import TaskAccepted
from refloop.checkpoints.diff import CheckpointDiff, diff_checkpoints
from refloop.checkpoints.manifest import ManifestError
from refloop.checkpoints.objects import ObjectStore
from refloop.checkpoints.rewind import run_checkpoints
from refloop.checkpoints.stores import object_store_for
from refloop.contract.checkpoints import CHECKPOINT_ID
from refloop.contract.task import RecordTaskInput, TaskInput
from refloop.contract.visibility import start_metadata
from refloop.runtime.workspaces import (
    WorkspaceError,
    ensure_fresh_workspace,
    resolve_workspace,
)
from refloop.settings import Settings
from refloop.store.db import TERMINAL_STATUSES, Store, TaskRecord
from refloop.workflows.agent import AgentTaskWorkflow

router = APIRouter(prefix="/tasks", tags=["tasks"])
CheckpointId = Annotated[str | None, Query(pattern=CHECKPOINT_ID,
                                           description="a checkpoint id (64 hex digits)")]
DIFF_RESPONSES: dict[int | str, dict[str, Any]] = {
    404: {"description": "No such agent task, no such checkpoint of it, or its content is "
                         "no longer in the store"},
    409: {"description": "The stored checkpoint cannot be read"},
}


class RunCheckpoint(BaseModel):
    step: int  # what `to_step` (rewind) and `at_step` (fork) name
    call: str  # the call after which it was taken: `<iteration>.<index>`
    checkpoint: str


class RunCheckpoints(BaseModel):
    task_id: str
    run_id: str
    checkpoints: list[RunCheckpoint]


def objects(request: Request, settings: Settings, store: Store) -> ObjectStore:
    found = getattr(request.app.state, "checkpoint_objects", None)
    if found is None:
        found = request.app.state.checkpoint_objects = object_store_for(settings,
                                                                         store.engine)
    return found


def fork_origin(row: TaskRecord) -> str | None:
    """The checkpoint a fork's workspace started from (the task's own input says it)."""
    fork = (row.input or {}).get("fork")
    origin = fork.get("checkpoint_id") if isinstance(fork, dict) else None
    return origin if isinstance(origin, str) and re.fullmatch(CHECKPOINT_ID, origin) else None


def pick(row: TaskRecord, taken: list[str], checkpoint: str | None, base: str | None,
         since_start: bool) -> tuple[str | None, str]:
    """(base, checkpoint) among the task's own: by default the whole task (from before its
    first checkpoint to its last), or one checkpoint against the one before it."""
    origin = fork_origin(row)
    own = set(taken) | {origin} - {None}
    for given in (checkpoint, base):
        if given is not None and given not in own:
            raise not_found(f"checkpoint {given[:12]} of task {row.task_id}")
    if checkpoint is None:
        if not taken:
            raise not_found(f"a checkpoint of task {row.task_id} (it changed nothing yet)")
        checkpoint, since_start = taken[-1], True
    if base is not None:
        return base, checkpoint
    if checkpoint == origin:  # a fork's start: against an empty workspace
        return None, checkpoint
    if since_start:
        return origin, checkpoint
    at = taken.index(checkpoint)
    return (taken[at - 1] if at else origin), checkpoint


@router.get("/{task_id}/diff", response_model=CheckpointDiff, responses=DIFF_RESPONSES)
async def task_diff(task_id: TaskId, request: Request, store: StoreDep, settings: SettingsDep,
                    checkpoint: CheckpointId = None, base: CheckpointId = None,
                    since_start: bool = False) -> CheckpointDiff:
    """What changed in the task's workspace, file by file, with a unified diff of text
    files: from `base` to `checkpoint`, both the task's own. Without `checkpoint`: its
    last. Without `base`: the checkpoint before it, or with `since_start` (and without
    `checkpoint`) the task's start: an empty workspace, or the checkpoint a fork began at."""
    row = await task_row(store, task_id, kind="agent")
    taken = [r.checkpoint_id for r in await asyncio.to_thread(store.checkpoints_of,
                                                                 row.task_id)]
    before, head = pick(row, taken, checkpoint, base, since_start)
    try:
        return await asyncio.to_thread(diff_checkpoints, objects(request, settings, store),
                                       before, head)
    except KeyError:
        raise not_found(f"the content of checkpoint {head[:12]} in the store") from None
    except (ManifestError, ValueError) as err:
        raise HTTPException(status.HTTP_409_CONFLICT,
                            f"checkpoint {head[:12]} cannot be read: {err}") from None


@router.get("/{task_id}/checkpoints", response_model=RunCheckpoints,
            responses={404: {"description": "No such agent task"}})
async def run_checkpoint_list(task_id: TaskId, client: ClientDep,
                              store: StoreDep) -> RunCheckpoints:
    """The checkpoints of the task's current run, numbered as `POST /tasks/{id}/rewind`
    (`to_step`) and `/fork` (`at_step`) take them: a rewound or continued run counts
    afresh."""
    row = await task_row(store, task_id, kind="agent")
    try:
        run_id, _, events = await branching._latest_run(client, row.workflow_id)
    except branching.BranchRefused as err:
        raise HTTPException(err.status, err.message) from err
    return RunCheckpoints(task_id=task_id, run_id=run_id, checkpoints=[
        RunCheckpoint(step=c.step, call=".".join(c.call_id.split(".")[-2:]),
                      checkpoint=c.checkpoint_id) for c in run_checkpoints(events)])


RERUN_RESPONSES: dict[int | str, dict[str, Any]] = {
    404: {"description": "No such agent task"},
    409: {"description": "The task has not ended, or its input cannot be read"},
    422: {"description": "Its workspace is no longer under the roots (or its host's)"},
}


def rerun_input(row: TaskRecord, task_id: str) -> TaskInput:
    """The task's own input as a new task of its own: not resumed, not a fork's or a
    supplement's start (its text and workspace say what to do)."""
    try:
        inp = TaskInput.model_validate(row.input or {})
    except ValidationError:
        raise HTTPException(status.HTTP_409_CONFLICT,
                            f"task {row.task_id}'s input cannot be read") from None
    return inp.model_copy(update={"task_id": task_id, "resume_state": None, "fork": None,
                                  "is_supplement": False, "preset_plan": None,
                                  "prior_context": None})


@router.post("/{task_id}/rerun", response_model=TaskAccepted, status_code=202,
             responses=RERUN_RESPONSES)
async def rerun(task_id: TaskId, client: ClientDep, store: StoreDep,
                settings: SettingsDep) -> TaskAccepted:
    """Start a new task with this ended task's input: the same text, workspace (as it is
    now), session, model and settings."""
    row = await task_row(store, task_id, kind="agent")
    if row.status not in TERMINAL_STATUSES:
        raise HTTPException(status.HTTP_409_CONFLICT, f"task {task_id} is {row.status}: "
                            "rerun it once it has ended (its workspace is in use)")
    new_id = f"task-{uuid.uuid4().hex[:12]}"
    inp = rerun_input(row, new_id)
    if inp.host is not None:
        await recheck_host(store, inp.workspace, inp.host)
    else:
        try:
            await asyncio.to_thread(ensure_fresh_workspace, inp.workspace, settings)
            await asyncio.to_thread(resolve_workspace, inp.workspace, settings)
        except WorkspaceError as err:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(err)) from err
    record = RecordTaskInput(task_id=new_id, workflow_id=new_id, session_id=inp.session_id,
                             status="queued", input=inp.model_dump(mode="json"))
    await asyncio.to_thread(store.record_task, record)
    try:
        await client.start_workflow(AgentTaskWorkflow.run, inp, id=new_id,
                                    task_queue=settings.task_queue,
                                    **start_metadata(inp.task, inp.workspace))
    except RPCError as err:  # the row must not claim a task that never started
        await asyncio.to_thread(store.record_task, record.model_copy(update={
            "status": "failed", "input": None,
            "error": f"workflow did not start: {err.message}"}))
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE,
                            "Temporal did not start the task") from err
    return TaskAccepted(task_id=new_id, workflow_id=new_id)
