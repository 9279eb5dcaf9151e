"""A task as GET /tasks shows it: its live state, told within TEMPORAL_ANSWER_S.

- `waiting_approval` is a status: the workflow's progress says so, and a listing finds the
  waiting tasks through refloop's `RefloopStatus` search attribute (rows store `running`).
- Temporal down or slow: the stored row answers, marked `from_database`, never a wait of
  the client's whole retry budget (it was 19.8 s).
- The model and endpoint the task really uses, from its stored input.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio.client import Client

from refloop.api.reconcile import OPEN_STATUSES, refresh, within
from refloop.api.schemas import TaskState
from refloop.contract import visibility
from refloop.contract.task import TaskProgress
from refloop.settings import Settings
from refloop.store.db import TERMINAL_STATUSES, Store, TaskRecord
from refloop.workflows.agent import AgentTaskWorkflow

TEMPORAL_ANSWER_S = 1.5  # then the stored row answers: GET stays under 2 s
WAITING = "waiting_approval"


def used_model(row: TaskRecord, settings: Settings) -> tuple[str | None, str | None]:
    """(model, endpoint) the task runs with: its model config's, else the task's model on
    the worker's own endpoint."""
    inp: dict[str, Any] = row.input or {}
    endpoint = inp.get("endpoint") or {}
    if row.kind != "agent":
        return inp.get("model") or settings.review_model(), "the worker's endpoint"
    model = endpoint.get("model") or inp.get("model") or settings.refloop_model
    url = endpoint.get("base_url") or settings.openai_base_url or "the worker's endpoint"
    return model, url


def public(row: TaskRecord, settings: Settings, **fields: Any) -> TaskState:
    model, endpoint = used_model(row, settings)
    return TaskState(**{**row.model_dump(), "model": model, "endpoint": endpoint, **fields})


async def waiting_ids(client: Client, seconds: float = TEMPORAL_ANSWER_S) -> set[str] | None:
    """Workflow IDs of agent tasks waiting for a decision; None when Temporal is silent."""
    query = (f'{visibility.STATUS.name} = "{WAITING}" AND ExecutionStatus = "Running"')

    async def collect() -> set[str]:
        return {wf.id async for wf in client.list_workflows(query, limit=10_000)}

    try:
        return await within(collect(), seconds)
    except Exception:  # noqa: BLE001 (down, slow, or no such attribute: the rows answer)
        return None


async def live_state(client: Client, store: Store, row: TaskRecord,
                     settings: Settings) -> TaskState:
    """The row with its workflow's progress; the stored row alone when Temporal is silent."""
    if row.status not in OPEN_STATUSES:
        return public(row, settings)

    async def ask() -> tuple[TaskRecord, TaskProgress | None]:
        if row.kind == "agent":
            try:
                handle = client.get_workflow_handle(row.workflow_id)
                progress = await handle.query(AgentTaskWorkflow.progress)
                if progress.status not in TERMINAL_STATUSES:
                    return row, progress
                # Ended but not yet recorded (or its record lost): Temporal says which.
                return await refresh(client, store, row), progress
            except Exception:  # noqa: BLE001 (not picked up yet or gone: ask Temporal)
                pass
        return await refresh(client, store, row), None

    try:
        fresh, progress = await within(ask(), TEMPORAL_ANSWER_S)
    except Exception:  # noqa: BLE001 (Temporal down or slow: the stored row, marked)
        return public(row, settings, from_database=True)
    status = progress.status if progress is not None and progress.status == WAITING \
        else fresh.status
    return public(fresh, settings, status=status, progress=progress)


async def listed(client: Client, store: Store, settings: Settings, session_id: str | None,
                 status: str | None) -> list[TaskState]:
    """GET /tasks: stored rows, waiting ones told apart, closed code reviews followed."""
    stored = "running" if status == WAITING else status
    rows = await asyncio.to_thread(store.list_tasks, session_id=session_id, status=stored)
    # One budget for the whole listing: Temporal silent, every row answers as stored.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TEMPORAL_ANSWER_S
    waiting: set[str] | None = set()
    if any(row.kind == "agent" and row.status == "running" for row in rows):
        waiting = await waiting_ids(client, TEMPORAL_ANSWER_S)
    silent = waiting is None
    states = []
    for row in rows:
        left = deadline - loop.time()
        if row.kind != "agent" and row.status in OPEN_STATUSES and not silent:
            try:  # nobody else updates code-review rows
                row = await within(refresh(client, store, row), max(left, 0.05))
            except Exception:  # noqa: BLE001 (Temporal silent: the row as stored)
                silent = True
        shown = WAITING if waiting and row.workflow_id in waiting else row.status
        states.append(public(row, settings, status=shown, from_database=silent))
    return [state for state in states if status is None or state.status == status]
