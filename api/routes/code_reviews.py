"""/code-reviews: start the code-review supervisor and read its result."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from fastapi import APIRouter, HTTPException, status
from pydantic import BaseModel
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError

from api.deps import ClientDep, SettingsDep, StoreDep
from refloop.code_review_models import CodeReviewInput, CodeReviewResult
from refloop.models import RecordTaskInput
from refloop.store import CodeReviewContentRecord
from refloop.visibility import start_metadata
from workflows.code_review import CodeReviewWorkflow

router = APIRouter(prefix="/code-reviews", tags=["code-reviews"])


class CodeReviewAccepted(BaseModel):
    task_id: str
    workflow_id: str


class CodeReviewState(BaseModel):
    task_id: str
    status: str
    stage: str | None = None
    result: CodeReviewResult | None = None
    content_record: dict[str, Any] | None = None


@router.post("", response_model=CodeReviewAccepted, status_code=202)
async def start_review(body: CodeReviewInput, client: ClientDep, store: StoreDep,
                       settings: SettingsDep) -> CodeReviewAccepted:
    task_id = body.task_id or f"review-{uuid.uuid4().hex[:12]}"
    request = body.model_copy(update={"task_id": task_id})
    await asyncio.to_thread(store.record_task, RecordTaskInput(
        task_id=task_id, workflow_id=task_id, kind="code_review", status="queued",
        input=request.model_dump(mode="json")))
    await client.start_workflow(CodeReviewWorkflow.run, request, id=task_id,
                                task_queue=settings.refloop_task_queue,
                                **start_metadata(f"code review ({request.review_type}) "
                                                 f"{request.task_desc}".strip()))
    return CodeReviewAccepted(task_id=task_id, workflow_id=task_id)


@router.get("/{task_id}", response_model=CodeReviewState)
async def get_review(task_id: str, client: ClientDep, store: StoreDep) -> CodeReviewState:
    handle = client.get_workflow_handle(task_id, result_type=CodeReviewResult)
    try:
        description = await handle.describe()
    except RPCError as err:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"code review {task_id} not found") \
            from err
    record = await asyncio.to_thread(store.get, CodeReviewContentRecord, task_id)
    content = record.model_dump(mode="json") if record else None
    if description.status == WorkflowExecutionStatus.COMPLETED:
        result = await handle.result()
        return CodeReviewState(task_id=task_id, status=result.status, stage="done",
                               result=result, content_record=content)
    if description.status == WorkflowExecutionStatus.RUNNING:
        stage = (await handle.query(CodeReviewWorkflow.status))["stage"]
        return CodeReviewState(task_id=task_id, status="running", stage=stage,
                               content_record=content)
    return CodeReviewState(task_id=task_id, status=description.status.name.lower(),
                           content_record=content)
