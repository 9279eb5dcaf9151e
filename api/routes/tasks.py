"""Interactive sessions and tasks: start, stream, inspect, cancel, approve."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Query, Request, status
from fastapi.responses import StreamingResponse
from opentelemetry import propagate
from temporalio.client import WorkflowUpdateFailedError
from temporalio.service import RPCError

from api.deps import ClientDep, SettingsDep, StoreDep
from api.schemas import (
    ApprovalBody,
    ApprovalOutcome,
    SessionStart,
    SessionStarted,
    TaskAccepted,
    TaskCreate,
    TaskState,
)
from api.sse import event_stream
from refloop.models import ApprovalDecision, RecordTaskInput, TaskInput
from refloop.settings import Settings
from refloop.store import ModelConfigRecord, PromptRecord, SessionRecord, Store, TaskRecord
from refloop.telemetry import tracer
from refloop.visibility import start_metadata
from workflows.agent import AgentTaskWorkflow

interactive = APIRouter(prefix="/agent/interactive", tags=["interactive"])
tasks = APIRouter(prefix="/tasks", tags=["tasks"])
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def not_found(what: str) -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND, f"{what} not found")


@interactive.post("/start", response_model=SessionStarted, status_code=201)
def start_session(body: SessionStart, store: StoreDep, settings: SettingsDep) -> SessionStarted:
    if not Path(body.workspace).is_dir():
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                            f"workspace {body.workspace!r} is not an existing directory")
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
    # The body overrides the prompt's stored review settings (seed 000).
    review = body.enable_quality_review
    if review is None:
        review = prompt.enable_quality_review if prompt else False
    session = store.add(SessionRecord(
        session_id=f"sess-{uuid.uuid4().hex[:12]}",
        workspace=str(Path(body.workspace).resolve()),
        prompt_id=body.prompt_id,
        system_prompt=body.system_prompt or (prompt.system_prompt if prompt else None),
        enable_quality_review=review,
        quality_review_rules=body.quality_review_rules
        or (prompt.quality_review_rules if prompt else None),
        model=model,
        model_config_id=body.model_config_id,
        approval_mode=body.approval_mode,
        mcp_servers=known_mcp_servers(body.mcp_servers, settings) or None,
    ))
    return SessionStarted(session_id=session.session_id)


def known_mcp_servers(names: list[str], settings: Settings) -> list[str]:
    """Names the MCP configuration knows, or 422 naming the unknown ones."""
    from refloop.mcp_config import McpConfigError, choose, load_config

    if not names:
        return []
    try:
        return list(choose(load_config(settings.refloop_mcp_config), names))
    except McpConfigError as err:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(err)) from None


def task_input(body: TaskCreate, session: SessionRecord, settings: Settings,
               task_id: str) -> TaskInput:
    """The session's settings, with the task body's overrides on top."""
    def pick(override, inherited):
        return inherited if override is None else override

    return TaskInput(
        task=body.task,
        workspace=session.workspace,
        task_id=task_id,
        session_id=session.session_id,
        model=session.model,
        system_prompt=session.system_prompt,
        enable_quality_review=pick(body.enable_quality_review, session.enable_quality_review),
        quality_review_rules=pick(body.quality_review_rules, session.quality_review_rules),
        approval_mode=pick(body.approval_mode, session.approval_mode),
        enable_reflection=pick(body.enable_reflection, settings.enable_reflection),
        reflection_max_supplements=settings.reflection_max_supplements,
        reflection_max_rounds=settings.reflection_max_rounds,
        max_iterations=body.max_iterations,
        mcp_servers=known_mcp_servers(pick(body.mcp_servers, session.mcp_servers or []),
                                      settings),
    )


async def start_task(body: TaskCreate, client, store: Store, settings: Settings,
                     headers: dict[str, str] | None = None) -> TaskAccepted:
    session = await asyncio.to_thread(store.get, SessionRecord, body.session_id)
    if session is None:
        raise not_found(f"session {body.session_id}")
    workflow_id = f"task-{uuid.uuid4().hex[:12]}"
    inp = task_input(body, session, settings, workflow_id)
    # The row exists before the workflow runs, so GET /tasks/{id} answers at once.
    await asyncio.to_thread(store.record_task, RecordTaskInput(
        task_id=workflow_id, workflow_id=workflow_id, session_id=session.session_id,
        status="queued", input=inp.model_dump(mode="json")))
    # The caller's trace (W3C traceparent) becomes the parent of the task's spans.
    with tracer.start_as_current_span("start task", context=propagate.extract(headers or {})):
        await client.start_workflow(AgentTaskWorkflow.run, inp, id=workflow_id,
                                    task_queue=settings.refloop_task_queue,
                                    **start_metadata(inp.task, inp.workspace))
    return TaskAccepted(task_id=workflow_id, workflow_id=workflow_id)


@interactive.post("/task", response_model=TaskAccepted, status_code=202)
async def create_task(body: TaskCreate, client: ClientDep, store: StoreDep,
                      settings: SettingsDep, request: Request) -> TaskAccepted:
    return await start_task(body, client, store, settings, dict(request.headers))


@interactive.post("/task/stream", response_class=StreamingResponse,
                  responses={200: {"content": {"text/event-stream": {}}}})
async def create_task_stream(body: TaskCreate, client: ClientDep, store: StoreDep,
                             settings: SettingsDep, request: Request) -> StreamingResponse:
    accepted = await start_task(body, client, store, settings, dict(request.headers))
    return StreamingResponse(
        event_stream(client, store, accepted.task_id, accepted.workflow_id),
        media_type="text/event-stream",
        headers={**SSE_HEADERS, "X-Task-Id": accepted.task_id},
    )


async def task_row(store: Store, task_id: str) -> TaskRecord:
    row = await asyncio.to_thread(store.get_task, task_id)
    if row is None:
        raise not_found(f"task {task_id}")
    return row


@tasks.get("", response_model=list[TaskState])
def list_tasks(store: StoreDep, session_id: str | None = None,
               task_status: Annotated[str | None, Query(alias="status")] = None
               ) -> list[TaskState]:
    rows = store.list_tasks(session_id=session_id, status=task_status)
    return [TaskState(**row.model_dump()) for row in rows]


@tasks.get("/{task_id}", response_model=TaskState)
async def get_task(task_id: str, client: ClientDep, store: StoreDep) -> TaskState:
    row = await task_row(store, task_id)
    state = TaskState(**row.model_dump())
    if row.status in ("queued", "running"):
        try:
            handle = client.get_workflow_handle(row.workflow_id)
            state.progress = await handle.query(AgentTaskWorkflow.progress)
        except Exception:  # not picked up yet: the stored row is the truth
            pass
    return state


@tasks.get("/{task_id}/events", response_class=StreamingResponse,
           responses={200: {"content": {"text/event-stream": {}}}})
async def task_events(task_id: str, client: ClientDep, store: StoreDep,
                      last_event_id: Annotated[str | None, Header()] = None
                      ) -> StreamingResponse:
    row = await task_row(store, task_id)
    after = int(last_event_id) if last_event_id and last_event_id.isdigit() else 0
    return StreamingResponse(event_stream(client, store, task_id, row.workflow_id, after),
                             media_type="text/event-stream", headers=SSE_HEADERS)


@tasks.post("/{task_id}/cancel", status_code=202)
async def cancel_task(task_id: str, client: ClientDep, store: StoreDep) -> dict[str, str]:
    row = await task_row(store, task_id)
    if row.status in ("completed", "failed", "cancelled"):
        raise HTTPException(status.HTTP_409_CONFLICT, f"task {task_id} has already ended")
    await client.get_workflow_handle(row.workflow_id).cancel()
    return {"task_id": task_id, "status": "cancelling"}


@tasks.post("/{task_id}/approvals", response_model=ApprovalOutcome)
async def decide(task_id: str, body: ApprovalBody, client: ClientDep,
                 store: StoreDep) -> ApprovalOutcome:
    row = await task_row(store, task_id)
    handle = client.get_workflow_handle(row.workflow_id)
    try:
        outcome = await handle.execute_update(
            AgentTaskWorkflow.decide_approval,
            ApprovalDecision(call_id=body.call_id, approved=body.approved,
                             comment=body.comment),
        )
    # The test server reports a validator rejection as NOT_FOUND, a real one as a failure.
    except (WorkflowUpdateFailedError, RPCError) as err:
        raise HTTPException(status.HTTP_409_CONFLICT,
                            f"call {body.call_id!r} is not awaiting a decision") from err
    return ApprovalOutcome(call_id=body.call_id, outcome=outcome)
