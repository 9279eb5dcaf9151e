"""Interactive sessions and tasks: start, stream, inspect, cancel, approve."""

from __future__ import annotations

import asyncio
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Query, Request, status
from fastapi import Path as PathParam
from fastapi.responses import StreamingResponse
from opentelemetry import propagate
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from refloop.api import branching
from refloop.api.deps import ClientDep, SettingsDep, StoreDep
from refloop.api.reconcile import OPEN_STATUSES, is_not_found, mark_lost
from refloop.api.routes.hosts import (
    live_host_holding,
    place_workspace,
    recheck_host,
    unprocessable,
)
from refloop.api.schemas import (
    ApprovalBody,
    ApprovalOutcome,
    ForkBody,
    MoveBody,
    RewindBody,
    SessionStart,
    SessionStarted,
    TaskAccepted,
    TaskCreate,
    TaskForked,
    TaskMoved,
    TaskRewound,
    TaskStart,
    TaskStarted,
    TaskState,
)
from refloop.api.sse import event_stream
from refloop.api.task_view import TaskFilters, listed, live_state
from refloop.contract.activity_io import ApprovalDecision, ModelEndpoint
from refloop.contract.budget import ModelPrice
from refloop.contract.errors import InvalidApprovalEdit
from refloop.contract.hosts import HostMove, HostRefused
from refloop.contract.task import RecordTaskInput, TaskInput
from refloop.contract.visibility import start_metadata
from refloop.runtime.telemetry import tracer
from refloop.runtime.workspaces import (
    ID_PATTERN,
    WorkspaceError,
    ensure_fresh_workspace,
    host_workspace,
    resolve_workspace,
)
from refloop.settings import Settings
from refloop.store.db import (
    TERMINAL_STATUSES,
    ModelConfigRecord,
    PromptRecord,
    SessionRecord,
    Store,
    TaskRecord,
)
from refloop.store.hosts import list_hosts
from refloop.workflows.agent import AgentTaskWorkflow

interactive = APIRouter(prefix="/agent/interactive", tags=["interactive"])
tasks = APIRouter(prefix="/tasks", tags=["tasks"])
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# Each event is an object (OpenAPI 3.2's itemSchema; no `schema`, which would describe the
# stream as a whole, and schemathesis reads it as the list of events): the
# task's event list (`id` its seq, for resuming) and `status` frames (no `id`).
SSE_EVENT = {"type": "object", "required": ["event", "data"], "properties": {
    "id": {"type": "string", "description": "the event's seq (resume with ?after= or "
                                            "Last-Event-ID); absent on status frames"},
    "event": {"type": "string", "description": "the event's type: approval_required, "
              "tool_result, completed, ... or `status` (the task's status changed)"},
    "data": {"type": "string", "contentMediaType": "application/json",
             "contentSchema": {"type": "object"},
             "description": "the event's fields as one JSON object; a status frame: "
                            "{status, temporal?, from_database?}"}}}
SSE_RESPONSE = {200: {"content": {"text/event-stream": {"itemSchema": SSE_EVENT}},
                      "description": "Server-Sent Events until the task ends"}}
TaskId = Annotated[str, PathParam(pattern=ID_PATTERN)]


def not_found(what: str) -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND, f"{what} not found")


@interactive.post("/start", response_model=SessionStarted, status_code=201)
async def start_session(body: SessionStart, store: StoreDep,
                        settings: SettingsDep) -> SessionStarted:
    workspace, host = await place_workspace(store, settings, body.workspace, body.host)
    return await asyncio.to_thread(_new_session, body, store, settings, workspace, host)


def _new_session(body: SessionStart, store: Store, settings: Settings, workspace: str,
                 host: str | None) -> SessionStarted:
    prompt = None
    if body.prompt_id is not None:
        prompt = store.get(PromptRecord, body.prompt_id)
        if prompt is None:
            raise not_found(f"prompt {body.prompt_id}")
    model = body.model
    if body.model_config_id is not None:
        config = store.get(ModelConfigRecord, body.model_config_id)
        if config is None:
            raise not_found(f"model config {body.model_config_id}")
        model = model or config.model
    # The body overrides the prompt's stored review settings.
    review = body.enable_quality_review
    if review is None:
        review = prompt.enable_quality_review if prompt else False
    session = store.add(SessionRecord(
        session_id=f"sess-{uuid.uuid4().hex[:12]}",
        workspace=workspace,
        host=host,
        prompt_id=body.prompt_id,
        system_prompt=body.system_prompt or (prompt.system_prompt if prompt else None),
        enable_quality_review=review,
        quality_review_rules=body.quality_review_rules
        or (prompt.quality_review_rules if prompt else None),
        model=model,
        model_config_id=body.model_config_id,
        approval_mode=body.approval_mode,
        approval_timeout_s=body.approval_timeout_s,
        # its own limit, else its prompt's: its tasks' default
        max_cost_usd=pick(body.max_cost_usd, prompt.max_cost_usd if prompt else None),
        max_tokens=pick(body.max_tokens, prompt.max_tokens if prompt else None),
        mcp_servers=known_mcp_servers(body.mcp_servers, settings) or None,
    ))
    return SessionStarted(session_id=session.session_id, host=session.host)


def known_mcp_servers(names: list[str], settings: Settings) -> list[str]:
    """Names the MCP configuration knows, or 422 naming the unknown ones."""
    from refloop.contract.errors import McpConfigError
    from refloop.mcp.config import choose, load_config

    if not names:
        return []
    try:
        return list(choose(load_config(settings.refloop_mcp_config), names))
    except McpConfigError as err:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(err)) from None


def endpoint_of(session: SessionRecord, config: ModelConfigRecord | None
                ) -> ModelEndpoint | None:
    """The session's model config as the task's endpoint (the key stays a variable NAME)."""
    if config is None:
        return None
    # its own price, else the worker's REFLOOP_MODEL_PRICES
    price = ModelPrice.model_validate(config.price) if config.price else None
    return ModelEndpoint(model=session.model or config.model, base_url=config.base_url,
                         api_key_env=config.api_key_env, temperature=config.temperature,
                         price=price, context_tokens=config.context_tokens)


def pick(override: Any, inherited: Any) -> Any:
    """A setting named (not None), else the one inherited."""
    return inherited if override is None else override


def task_input(body: TaskCreate, session: SessionRecord, settings: Settings,
               task_id: str, config: ModelConfigRecord | None = None) -> TaskInput:
    """The session's settings, with the task body's overrides on top."""
    return settings.task_input(
        task=body.task,
        workspace=session.workspace,
        task_id=task_id,
        session_id=session.session_id,
        model=session.model,
        endpoint=endpoint_of(session, config),
        system_prompt=session.system_prompt,
        enable_quality_review=pick(body.enable_quality_review, session.enable_quality_review),
        quality_review_rules=pick(body.quality_review_rules, session.quality_review_rules),
        approval_mode=pick(body.approval_mode, session.approval_mode),
        approval_timeout_s=pick(body.approval_timeout_s, session.approval_timeout_s),
        enable_reflection=body.enable_reflection,
        max_iterations=body.max_iterations,
        max_cost_usd=pick(body.max_cost_usd, session.max_cost_usd),
        max_tokens=pick(body.max_tokens, session.max_tokens),
        mcp_servers=known_mcp_servers(pick(body.mcp_servers, session.mcp_servers or []),
                                      settings),
        host=session.host,
    )


async def start_task(body: TaskCreate, client, store: Store, settings: Settings,
                     headers: dict[str, str] | None = None) -> TaskAccepted:
    session = await asyncio.to_thread(store.get, SessionRecord, body.session_id)
    if session is None:
        raise not_found(f"session {body.session_id}")
    if session.host is not None:  # its host still known, its roots still holding it
        await recheck_host(store, session.workspace, session.host)
    else:
        try:  # checked again: the roots may have changed since the session began
            await asyncio.to_thread(ensure_fresh_workspace, session.workspace, settings)
            await asyncio.to_thread(resolve_workspace, session.workspace, settings)
        except WorkspaceError as err:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(err)) from err
    workflow_id = f"task-{uuid.uuid4().hex[:12]}"
    config = None
    if session.model_config_id is not None:  # honoured per task: endpoint, model, temperature
        config = await asyncio.to_thread(store.get, ModelConfigRecord, session.model_config_id)
        if config is None:  # never run on the default endpoint under the config's name
            raise HTTPException(status.HTTP_409_CONFLICT, f"the session's model config "
                                f"{session.model_config_id} was deleted; start a new session")
    inp = task_input(body, session, settings, workflow_id, config)
    # The row exists before the workflow runs, so GET /tasks/{id} answers at once.
    await asyncio.to_thread(store.record_task, RecordTaskInput(
        task_id=workflow_id, workflow_id=workflow_id, session_id=session.session_id,
        status="queued", input=inp.model_dump(mode="json")))
    # The caller's trace (W3C traceparent) becomes the parent of the task's spans.
    with tracer.start_as_current_span("start task", context=propagate.extract(headers or {})):
        try:
            await client.start_workflow(AgentTaskWorkflow.run, inp, id=workflow_id,
                                        task_queue=settings.task_queue,
                                        **start_metadata(inp.task, inp.workspace))
        except RPCError as err:  # the row must not claim a task that never started
            await asyncio.to_thread(store.record_task, RecordTaskInput(
                task_id=workflow_id, workflow_id=workflow_id, session_id=session.session_id,
                status="failed", error=f"workflow did not start: {err.message}"))
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE,
                                "Temporal did not start the task") from err
    return TaskAccepted(task_id=workflow_id, workflow_id=workflow_id)


@interactive.post("/task", response_model=TaskAccepted, status_code=202)
async def create_task(body: TaskCreate, client: ClientDep, store: StoreDep,
                      settings: SettingsDep, request: Request) -> TaskAccepted:
    return await start_task(body, client, store, settings, dict(request.headers))


@interactive.post("/task/stream", response_class=StreamingResponse, responses=SSE_RESPONSE)
async def create_task_stream(body: TaskCreate, client: ClientDep, store: StoreDep,
                             settings: SettingsDep, request: Request) -> StreamingResponse:
    accepted = await start_task(body, client, store, settings, dict(request.headers))
    return StreamingResponse(
        event_stream(client, store, accepted.task_id, accepted.workflow_id),
        media_type="text/event-stream",
        headers={**SSE_HEADERS, "X-Task-Id": accepted.task_id},
    )


# What a session fixes for its tasks: POST /tasks takes them only when it makes the session.
SESSION_FIELDS = frozenset({"workspace", "host", "prompt_id", "system_prompt", "model",
                            "model_config_id"})
# What a task may set over its session's settings (TaskCreate's overrides).
TASK_FIELDS = frozenset(TaskCreate.model_fields) - {"session_id", "task"}
START_RESPONSES = {
    404: {"description": "No such session, prompt or model config"},
    422: {"description": "A workspace outside REFLOOP_WORKSPACE_ROOTS (or no host's), an "
                         "unknown MCP server, or a session's own setting given with "
                         "`session_id`"},
}


@tasks.post("", response_model=TaskStarted, status_code=202, responses=START_RESPONSES)
async def start_task_in_one_call(body: TaskStart, client: ClientDep, store: StoreDep,
                                 settings: SettingsDep, request: Request) -> TaskStarted:
    """Start a task in one call: a new session from the body's settings (as POST
    /agent/interactive/start), then its task (as POST /agent/interactive/task); with
    `session_id`, the task in that session, the body's task settings over its own."""
    session_id, host = body.session_id, None
    if session_id is None:
        fields = body.model_dump(include=set(SessionStart.model_fields))
        started = await start_session(SessionStart(**fields), store, settings)
        session_id, host = started.session_id, started.host
        overrides = body.model_dump(include={"enable_reflection", "max_iterations",
                                             "max_cost_usd", "max_tokens"})
    else:
        fixed = sorted(body.model_fields_set & SESSION_FIELDS)
        if fixed:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                                f"{', '.join(fixed)}: set by session {session_id}; leave "
                                "out session_id to start a new session with them")
        overrides = body.model_dump(include=set(body.model_fields_set & TASK_FIELDS))
    accepted = await start_task(TaskCreate(session_id=session_id, task=body.task, **overrides),
                                client, store, settings, dict(request.headers))
    if host is None and body.session_id is not None:
        session = await asyncio.to_thread(store.get, SessionRecord, session_id)
        host = session.host if session else None
    return TaskStarted(**accepted.model_dump(), session_id=session_id, host=host)


async def task_row(store: Store, task_id: str, kind: str | None = None) -> TaskRecord:
    """The row, or 404; with `kind`, a row of another kind is not this route's (404)."""
    row = await asyncio.to_thread(store.get_task, task_id)
    if row is None or (kind is not None and row.kind != kind):
        raise not_found(f"task {task_id}" if kind is None else f"{kind} task {task_id}")
    return row


def ended(task_id: str, row: TaskRecord) -> HTTPException:
    why = f": {row.error}" if row.error else ""
    return HTTPException(status.HTTP_409_CONFLICT,
                         f"task {task_id} has already ended ({row.status}{why})")


@tasks.get("", response_model=list[TaskState])
async def list_tasks(client: ClientDep, store: StoreDep, settings: SettingsDep,
                     session_id: Annotated[str | None, Query(max_length=200)] = None,
                     task_status: Annotated[str | None, Query(alias="status",
                                                              max_length=40)] = None,
                     kind: Annotated[str | None, Query(
                         max_length=40, description="agent_task or code_review")] = None,
                     host: Annotated[str | None, Query(max_length=200)] = None,
                     model: Annotated[str | None, Query(max_length=200)] = None,
                     q: Annotated[str | None, Query(
                         max_length=200, description="words the task's text contains")] = None,
                     limit: Annotated[int, Query(ge=1, le=500)] = 100,
                     ) -> list[TaskState]:
    """Tasks newest first, each with its live status (`waiting_approval`,
    `waiting_for_host`, ...); every filter given must hold."""
    return await listed(client, store, settings, TaskFilters(
        session_id=session_id, status=task_status, kind=kind, host=host, model=model, q=q,
        limit=limit))


@tasks.get("/{task_id}", response_model=TaskState)
async def get_task(task_id: TaskId, client: ClientDep, store: StoreDep,
                   settings: SettingsDep) -> TaskState:
    state = await live_state(client, store, await task_row(store, task_id), settings)
    forks = await asyncio.to_thread(store.forks_of, task_id)
    state.forks = [{"task_id": row.task_id, "step": (row.input or {})["fork"].get("step"),
                    "status": row.status} for row in forks]
    return state


@tasks.get("/{task_id}/events", response_class=StreamingResponse, responses=SSE_RESPONSE)
async def task_events(task_id: TaskId, client: ClientDep, store: StoreDep,
                      last_event_id: Annotated[str | None, Header(max_length=20)] = None
                      ) -> StreamingResponse:
    row = await task_row(store, task_id)
    after = int(last_event_id) if last_event_id and last_event_id.isdigit() else 0
    return StreamingResponse(event_stream(client, store, task_id, row.workflow_id, after),
                             media_type="text/event-stream", headers=SSE_HEADERS)


@tasks.post("/{task_id}/cancel", status_code=202)
async def cancel_task(task_id: TaskId, client: ClientDep, store: StoreDep) -> dict[str, str]:
    row = await task_row(store, task_id)
    if row.status in TERMINAL_STATUSES or row.status not in OPEN_STATUSES:
        raise ended(task_id, row)
    try:
        await client.get_workflow_handle(row.workflow_id).cancel()
    except RPCError as err:
        if not is_not_found(err):
            raise
        row = await mark_lost(store, row, f"workflow {row.workflow_id} not found in Temporal")
        raise ended(task_id, row) from err
    return {"task_id": task_id, "status": "cancelling"}


APPROVAL_RESPONSES = {
    404: {"description": "No such agent task"},
    409: {"description": "The task has ended, or the call is not waiting for a decision"},
    422: {"description": "Edited arguments the call's tool would refuse (the reason says "
                         "why); the call still waits"},
}


@tasks.post("/{task_id}/approvals", response_model=ApprovalOutcome,
            responses=APPROVAL_RESPONSES)
async def decide(task_id: TaskId, body: ApprovalBody, client: ClientDep,
                 store: StoreDep) -> ApprovalOutcome:
    """Approve or reject a call waiting for approval; an approval may carry the call's
    arguments as the person edited them."""
    row = await task_row(store, task_id, kind="agent")
    if row.status in TERMINAL_STATUSES:
        raise ended(task_id, row)
    handle = client.get_workflow_handle(row.workflow_id)
    try:
        outcome = await handle.execute_update(
            AgentTaskWorkflow.decide_approval,
            ApprovalDecision(call_id=body.call_id, approved=body.approved,
                             comment=body.comment, arguments=body.arguments),
        )
    except WorkflowUpdateFailedError as err:
        cause = err.cause
        if isinstance(cause, ApplicationError) and cause.type == InvalidApprovalEdit.__name__:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, cause.message) from err
        raise HTTPException(status.HTTP_409_CONFLICT,
                            f"call {body.call_id!r} is not awaiting a decision") from err
    # The test server reports a validator rejection as NOT_FOUND, a real one as a failure.
    except RPCError as err:
        raise HTTPException(status.HTTP_409_CONFLICT,
                            f"call {body.call_id!r} is not awaiting a decision") from err
    return ApprovalOutcome(call_id=body.call_id, outcome=outcome)


REWIND_RESPONSES = {
    404: {"description": "No such agent task"},
    409: {"description": "The task has ended or is not in its agent loop (fork it "
                         "instead), or the workspace could not be put back (nothing changed)"},
    422: {"description": "No such step: the task's current run took fewer checkpoints"},
    503: {"description": "Temporal did not answer: the rewind may still happen (the "
                         "task's events say)"},
}
FORK_RESPONSES = {
    404: {"description": "No such agent task"},
    422: {"description": "No such step, or a workspace that is not new or empty, or under "
                         "none of the host's roots"},
}


def refused(err: branching.BranchRefused) -> HTTPException:
    return HTTPException(err.status, err.message)


@tasks.post("/{task_id}/rewind", response_model=TaskRewound, responses=REWIND_RESPONSES)
async def rewind_task(task_id: TaskId, body: RewindBody, client: ClientDep,
                      store: StoreDep) -> TaskRewound:
    """Put a running task back to its Nth workspace checkpoint: its files, conversation
    and plan progress as they were after that call, then it goes on from there (as
    `refloop rewind`). Answers once done, at the task's next safe point. The calls taken
    back keep their cost in the task's stats, marked rewound."""
    row = await task_row(store, task_id, kind="agent")
    try:
        done = await branching.rewind(client, row.workflow_id, body.to_step)
    except branching.BranchRefused as err:
        raise refused(err) from err
    return TaskRewound(task_id=task_id, step=done.step, checkpoint=done.checkpoint_id,
                       call_id=done.call_id, run_id=done.run_id,
                       edits_taken_back=done.edits_taken_back,
                       rewound_tokens=done.rewound_tokens)


@tasks.post("/{task_id}/fork", response_model=TaskForked, status_code=202,
            responses=FORK_RESPONSES)
async def fork_task(task_id: TaskId, body: ForkBody, client: ClientDep, store: StoreDep,
                    settings: SettingsDep) -> TaskForked:
    """Start a new task from step N of this one (running or ended): a new workspace put
    back to that step's checkpoint, the plan, progress and conversation up to there, and
    `task` as a new instruction (as `refloop fork`). The original is left as it is."""
    row = await task_row(store, task_id, kind="agent")
    try:
        done = await branching.fork(client, store, settings, row.workflow_id, body.at_step,
                                    body.task, body.workspace)
    except branching.BranchRefused as err:
        raise refused(err) from err
    return TaskForked(task_id=done.task_id, forked_from=task_id, step=done.step,
                      checkpoint=done.checkpoint_id, workspace=done.workspace, host=done.host)


MOVE_RESPONSES = {
    404: {"description": "No such agent task"},
    409: {"description": "The task has ended, has no host, or is not waiting_for_host"},
    422: {"description": "The host is unknown, not live, or its roots do not hold the "
                         "task's workspace (or the path `workspace` names)"},
}


@tasks.post("/{task_id}/move", response_model=TaskMoved, responses=MOVE_RESPONSES)
async def move_task(task_id: TaskId, body: MoveBody, client: ClientDep,
                    store: StoreDep) -> TaskMoved:
    """Move a task waiting for a host that will never return to another live host whose
    roots hold its workspace, at the same path or at `workspace` (the copy's path there);
    the call it waits on is scheduled there at once."""
    row = await task_row(store, task_id, kind="agent")
    if row.status in TERMINAL_STATUSES:
        raise ended(task_id, row)
    workspace, before = row.input.get("workspace", ""), row.input.get("host")
    known = await asyncio.to_thread(list_hosts, store)
    try:
        if body.workspace is not None:  # the copy's path there
            workspace = host_workspace(body.workspace, body.host)
        target = live_host_holding(known, body.host, workspace)
    except (HostRefused, WorkspaceError) as err:
        raise unprocessable(err) from err
    handle = client.get_workflow_handle(row.workflow_id)
    moved_to = workspace if body.workspace is not None else None
    try:
        host = await handle.execute_update(AgentTaskWorkflow.move_to_host,
                                           HostMove(host=target, workspace=moved_to))
    # The validator's word (not waiting, no host, ...); the test server says NOT_FOUND.
    except WorkflowUpdateFailedError as err:
        raise HTTPException(status.HTTP_409_CONFLICT, describe_update_failure(err)) from err
    except RPCError as err:
        raise HTTPException(status.HTTP_409_CONFLICT, err.message) from err
    if row.session_id:  # the session's next tasks go to the new host too
        await asyncio.to_thread(move_session, store, row.session_id, host, moved_to)
    return TaskMoved(task_id=task_id, host=host, moved_from=before, workspace=workspace)


def describe_update_failure(err: WorkflowUpdateFailedError) -> str:
    cause = err.cause
    return getattr(cause, "message", None) or str(cause or err)


def move_session(store: Store, session_id: str, host: str,
                 workspace: str | None = None) -> None:
    """A moved task's session: its next tasks on the new host (and the copy's path)."""
    if store.get(SessionRecord, session_id) is not None:
        store.update(SessionRecord, session_id,
                     {"host": host, **({"workspace": workspace} if workspace else {})})
