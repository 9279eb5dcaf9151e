"""A task's spend limit: POST /tasks/{id}/budget sets it (the `raise_budget` update, which
refuses a limit below what the task has spent). A task waiting `waiting_for_budget` goes
on once the new limit covers its next model call."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status
from temporalio.client import WorkflowUpdateFailedError
from temporalio.service import RPCError

from refloop.api.deps import ClientDep, StoreDep
from refloop.api.routes.tasks import TaskId, describe_update_failure, ended, task_row
from refloop.api.schemas import BudgetBody, TaskBudget
from refloop.contract.budget import BudgetRaise
from refloop.store.db import TERMINAL_STATUSES
from refloop.workflows.agent import AgentTaskWorkflow

router = APIRouter(prefix="/tasks", tags=["tasks"])
BUDGET_RESPONSES = {
    404: {"description": "No such agent task"},
    409: {"description": "The task has ended, or the limit is below what it has spent "
                         "(the message says how much)"},
    422: {"description": "Neither max_cost_usd nor max_tokens given"},
}


@router.post("/{task_id}/budget", response_model=TaskBudget, responses=BUDGET_RESPONSES)
async def set_budget(task_id: TaskId, body: BudgetBody, client: ClientDep,
                     store: StoreDep) -> TaskBudget:
    """Set a task's spend limit (as `refloop budget`): totals with its children's spend. A
    supplement child running on a share of it gets its share of the new limit."""
    if body.max_cost_usd is None and body.max_tokens is None:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                            "name max_cost_usd or max_tokens (or both)")
    row = await task_row(store, task_id, kind="agent")
    if row.status in TERMINAL_STATUSES:
        raise ended(task_id, row)
    handle = client.get_workflow_handle(row.workflow_id)
    try:
        budget = await handle.execute_update(
            AgentTaskWorkflow.raise_budget,
            BudgetRaise(max_cost_usd=body.max_cost_usd, max_tokens=body.max_tokens))
    except WorkflowUpdateFailedError as err:  # the validator's word: spent more than that
        raise HTTPException(status.HTTP_409_CONFLICT, describe_update_failure(err)) from err
    except RPCError as err:
        raise HTTPException(status.HTTP_409_CONFLICT, err.message) from err
    return TaskBudget(task_id=task_id, **budget.model_dump())
