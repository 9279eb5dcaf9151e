"""/code-reviews: start the code-review supervisor and read its result.

Code reviews have their own ID space: a client's ID is refused (409) when any task holds
it, their workflows are named `code-review-<id>`, and /code-reviews/{id} answers only for
code reviews (an agent task's ID is 404 here).

A review may carry its own spend limit (`max_cost_usd`, `max_tokens`): at it, it waits
`waiting_for_budget` until POST /tasks/{id}/budget raises it, REFLOOP_BUDGET_WAIT_S at most.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, status
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field
from temporalio.client import WorkflowExecutionStatus
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from refloop.api.deps import ClientDep, SettingsDep, StoreDep
from refloop.api.reconcile import is_not_found, refresh
from refloop.api.routes.hosts import place_workspace, unprocessable
from refloop.api.routes.tasks import task_row
from refloop.api.schemas import JsonInt, LimitTokens, LimitUsd
from refloop.contract.budget import BudgetState
from refloop.contract.code_review import CodeReviewInput, CodeReviewResult
from refloop.contract.task import RecordTaskInput
from refloop.contract.visibility import start_metadata
from refloop.runtime.workspaces import ID_PATTERN, WorkspaceError, resolve_workspace
from refloop.store.db import TERMINAL_STATUSES, CodeReviewContentRecord
from refloop.workflows.code_review import CodeReviewWorkflow

router = APIRouter(prefix="/code-reviews", tags=["code-reviews"])
ReviewId = Annotated[str, PathParam(pattern=ID_PATTERN)]


class CodeReviewRequest(CodeReviewInput):
    """The workflow's input as the API takes it: strict types, no unknown fields."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [{
        "review_type": "snippet", "working_directory": ".", "content": "eval(x)",
        "output_format": "simple"}]})

    max_content_lines: JsonInt = Field(default=3000, ge=10, le=1_000_000)
    # The review's spend limit, its own (USD at REFLOOP_MODEL_PRICES; tokens). At it the
    # review waits `waiting_for_budget` until POST /tasks/{id}/budget raises it
    max_cost_usd: LimitUsd | None = None
    max_tokens: LimitTokens | None = None
    # How long it waits for a raise is the operator's (REFLOOP_BUDGET_WAIT_S), not a
    # client's
    budget_wait_s: None = Field(default=None, json_schema_extra={"readOnly": True})


class CodeReviewAccepted(BaseModel):
    task_id: str
    workflow_id: str


class CodeReviewState(BaseModel):
    task_id: str
    status: str
    stage: str | None = None
    # While it runs: its limit and spend (max_cost_usd, max_tokens, cost_usd, tokens,
    # waiting); once done, the result's `usage` and `budget` say them
    budget: BudgetState | None = None
    result: CodeReviewResult | None = None
    content_record: dict[str, Any] | None = None
    error: str | None = None


@router.post("", response_model=CodeReviewAccepted, status_code=202)
async def start_review(body: CodeReviewRequest, client: ClientDep, store: StoreDep,
                       settings: SettingsDep) -> CodeReviewAccepted:
    host = None
    if body.review_type == "file" or body.host is not None:
        # It reads files there: on the host holding them, else inside the API's roots.
        workdir, host = await place_workspace(store, settings, body.working_directory,
                                              body.host)
    else:  # the diff or snippet travels in the request: no host's disk is read
        try:  # inside REFLOOP_WORKSPACE_ROOTS only
            workdir = str(await asyncio.to_thread(resolve_workspace, body.working_directory,
                                                  settings))
        except WorkspaceError as err:
            raise unprocessable(err) from err
    task_id = body.task_id or f"review-{uuid.uuid4().hex[:12]}"
    workflow_id = f"code-review-{task_id}"
    limited = body.max_cost_usd is not None or body.max_tokens is not None
    request = CodeReviewInput.model_validate({
        **body.model_dump(), "task_id": task_id, "working_directory": workdir, "host": host,
        # as a task's: the operator's bound on the wait for a raise
        "budget_wait_s": settings.refloop_budget_wait_s if limited else None})
    record = RecordTaskInput(task_id=task_id, workflow_id=workflow_id, kind="code_review",
                             status="queued", input=request.model_dump(mode="json"))
    if not await asyncio.to_thread(store.claim_task, record):
        raise HTTPException(status.HTTP_409_CONFLICT, f"task ID {task_id!r} is taken")
    try:
        await client.start_workflow(CodeReviewWorkflow.run, request, id=workflow_id,
                                    task_queue=settings.task_queue,
                                    **start_metadata(f"code review ({request.review_type}) "
                                                     f"{request.task_desc}".strip()))
    except BaseException as err:  # any crash of the start: the row says `failed`, and why
        why = err.message if isinstance(err, RPCError) else type(err).__name__
        await asyncio.to_thread(store.record_task, record.model_copy(update={
            "status": "failed", "error": f"workflow did not start: {why}"}))
        if isinstance(err, WorkflowAlreadyStartedError):
            raise HTTPException(status.HTTP_409_CONFLICT,
                                f"task ID {task_id!r} is taken") from err
        if isinstance(err, RPCError):
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE,
                                "Temporal did not start the review") from err
        raise
    return CodeReviewAccepted(task_id=task_id, workflow_id=workflow_id)


@router.get("/{task_id}", response_model=CodeReviewState)
async def get_review(task_id: ReviewId, client: ClientDep, store: StoreDep) -> CodeReviewState:
    row = await task_row(store, task_id, kind="code_review")
    record = await asyncio.to_thread(store.get, CodeReviewContentRecord, task_id)
    content = record.model_dump(mode="json") if record else None
    handle = client.get_workflow_handle(row.workflow_id, result_type=CodeReviewResult)
    try:
        description = await handle.describe()
    except RPCError as err:
        if not is_not_found(err):
            raise
        if row.status not in TERMINAL_STATUSES:
            row = await refresh(client, store, row)  # failed (never started) or lost
        result = CodeReviewResult.model_validate(row.result) if row.result else None
        return CodeReviewState(task_id=task_id, status=row.status, result=result,
                               content_record=content, error=row.error)
    if description.status == WorkflowExecutionStatus.RUNNING:
        try:
            told = await handle.query(CodeReviewWorkflow.status)
        except RPCError:  # not on a worker yet
            told = {}
        stage, spend = told.get("stage"), told.get("budget")
        # A wait is its status, as a task's is (waiting_for_host, waiting_for_budget)
        live = stage if stage in ("waiting_for_host", "waiting_for_budget") else "running"
        return CodeReviewState(task_id=task_id, status=live, stage=stage,
                               budget=BudgetState.model_validate(spend) if spend else None,
                               content_record=content)
    row = await refresh(client, store, row)  # the row follows its closed workflow
    if description.status == WorkflowExecutionStatus.COMPLETED:
        result = await handle.result()
        return CodeReviewState(task_id=task_id, status=result.status, stage="done",
                               result=result, content_record=content)
    # The row now holds refloop's word for the closed workflow (failed, cancelled, ...).
    return CodeReviewState(task_id=task_id, status=row.status, content_record=content,
                           error=row.error)
