"""A task's spend limit: POST /tasks/{id}/budget sets it (the `raise_budget` update, which
refuses a limit below what the task has spent). A task waiting `waiting_for_budget` goes
on once the new limit covers its next model call. A code review's limit is set the same way
(its workflow answers the same update)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, status
from temporalio.client import WorkflowHandle, WorkflowQueryFailedError, WorkflowUpdateFailedError
from temporalio.service import RPCError

from refloop.api.deps import ClientDep, StoreDep
from refloop.api.routes.tasks import TaskId, describe_update_failure, ended, not_found, task_row
from refloop.api.schemas import BudgetBody, TaskBudget
from refloop.contract.budget import RAISE_BUDGET_UPDATE, BudgetRaise, BudgetState
from refloop.store.db import TERMINAL_STATUSES
from refloop.workflows.agent import AgentTaskWorkflow
from refloop.workflows.code_review import CodeReviewWorkflow

router = APIRouter(prefix="/tasks", tags=["tasks"])
BUDGET_RESPONSES = {
    404: {"description": "No such agent task or code review"},
    409: {"description": "The task has ended, or the limit is below what it has spent "
                         "(the message says how much)"},
    422: {"description": "A limit that is not a number above 0"},
}


@router.post("/{task_id}/budget", response_model=TaskBudget, responses=BUDGET_RESPONSES)
async def set_budget(task_id: TaskId, body: BudgetBody, client: ClientDep,
                     store: StoreDep) -> TaskBudget:
    """Set a task's spend limit (as `refloop budget`): totals with its children's spend. A
    supplement child running on a share of it gets its share of the new limit. A limit left
    out stays as it is (neither: the limit and spend as they are). A code review's limit is
    its own."""
    row = await task_row(store, task_id)
    if row.kind not in ("agent", "code_review"):
        raise not_found(f"agent task or code review {task_id}")
    if row.status in TERMINAL_STATUSES:
        raise ended(task_id, row)
    handle = client.get_workflow_handle(row.workflow_id)
    try:
        if body.max_cost_usd is None and body.max_tokens is None:
            return await unchanged(task_id, handle, row.kind)
        budget = await handle.execute_update(  # by name: a task's and a review's alike
            RAISE_BUDGET_UPDATE,
            BudgetRaise(max_cost_usd=body.max_cost_usd, max_tokens=body.max_tokens),
            result_type=BudgetState)
    except WorkflowUpdateFailedError as err:  # the validator's word: spent more than that
        raise HTTPException(status.HTTP_409_CONFLICT, describe_update_failure(err)) from err
    except (RPCError, WorkflowQueryFailedError) as err:  # ended meanwhile
        raise HTTPException(status.HTTP_409_CONFLICT, str(err)) from err
    return TaskBudget(task_id=task_id, **budget.model_dump())


async def unchanged(task_id: str, handle: WorkflowHandle[Any, Any], kind: str) -> TaskBudget:
    """The task's limit and spend now, from its progress (no limit: none)."""
    if kind == "code_review":
        told = await handle.query(CodeReviewWorkflow.status)
        return TaskBudget(task_id=task_id, **told["budget"])
    progress = await handle.query(AgentTaskWorkflow.progress)
    if progress.budget is not None:
        return TaskBudget(task_id=task_id, **progress.budget.model_dump())
    usage = progress.stats.usage
    return TaskBudget(task_id=task_id, cost_usd=usage.cost_usd, tokens=usage.total_tokens,
                      waiting=False)
