"""A task as GET /tasks shows it: its live state, told within TEMPORAL_ANSWER_S.

- `waiting_approval` is a status: the workflow's progress says so, and a listing tells
  every running task's status from refloop's `RefloopStatus` search attribute (rows store
  `running` while a task waits for a decision).
- Temporal down or slow: the stored row answers, marked `from_database`, never a wait of
  the client's whole retry budget (it was 19.8 s).
- The model and endpoint the task really uses, from its stored input.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel
from temporalio.client import Client

from refloop.api.reconcile import OPEN_STATUSES, refresh, within
from refloop.api.schemas import TaskState
from refloop.contract import visibility
from refloop.contract.task import TaskProgress, TaskStats
from refloop.settings import Settings
from refloop.store.db import TERMINAL_STATUSES, Store, TaskRecord
from refloop.workflows.agent import AgentTaskWorkflow
from refloop.workflows.code_review import CodeReviewWorkflow

TEMPORAL_ANSWER_S = 1.5  # then the stored row answers: GET stays under 2 s


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


def web_ui_link(settings: Settings, workflow_id: str) -> str | None:
    base = (settings.refloop_temporal_ui_url or "").rstrip("/")
    if not base:
        return None
    return f"{base}/namespaces/{quote(settings.temporal_namespace)}/workflows/" \
           f"{quote(workflow_id)}"


def stored_tokens(row: TaskRecord) -> int | None:
    usage = (row.usage or {}).get("usage")
    return usage.get("total_tokens") if isinstance(usage, dict) else None


def forked_from(inp: dict[str, Any]) -> dict[str, Any] | None:
    fork = inp.get("fork")
    if not isinstance(fork, dict):
        return None
    return {"task_id": fork.get("task_id"), "step": fork.get("step")}


def spend(row: TaskRecord, progress: TaskProgress | None) -> dict[str, Any]:
    """Its cost (with its children's, and its own), unpriced calls, and its limit now:
    live from the workflow's progress, else as last stored."""
    stats = progress.stats if progress is not None else \
        TaskStats.model_validate(row.usage) if row.usage else None
    inp: dict[str, Any] = row.input or {}
    budget: dict[str, Any] | None = None
    raised = [e.get("data") or {} for e in (row.result or {}).get("events") or []
              if isinstance(e, dict) and e.get("type") == "budget_raised"]
    if progress is not None and progress.budget is not None:
        budget = progress.budget.model_dump()
    elif raised:  # ended: its limit as last raised
        budget = {"max_cost_usd": raised[-1].get("max_cost_usd"),
                  "max_tokens": raised[-1].get("max_tokens")}
    elif isinstance((row.result or {}).get("budget"), dict):  # an ended code review's
        budget = {"max_cost_usd": row.result["budget"].get("max_cost_usd"),
                  "max_tokens": row.result["budget"].get("max_tokens")}
    elif inp.get("max_cost_usd") or inp.get("max_tokens"):  # as the task began
        budget = {"max_cost_usd": inp.get("max_cost_usd"), "max_tokens": inp.get("max_tokens")}
    if stats is None:
        return {"budget": budget}
    usage = stats.usage
    return {"cost_usd": usage.cost_usd,
            "own_cost_usd": round(usage.cost_usd - stats.children_usage.cost_usd, 9),
            "unpriced_calls": usage.unpriced_calls, "budget": budget}


def public(row: TaskRecord, settings: Settings, **fields: Any) -> TaskState:
    model, endpoint = used_model(row, settings)
    inp: dict[str, Any] = row.input or {}
    task = inp.get("task")
    if task is None and row.kind != "agent":  # a code review: what it looks at
        task = inp.get("target") or inp.get("mode")
    told = {"model": model, "endpoint": endpoint, "kind": visibility.kind_name(row.kind),
            "task": task if isinstance(task, str) else None, "host": inp.get("host"),
            "tokens": stored_tokens(row), "duration_s": row.duration_s,
            "web_ui": web_ui_link(settings, row.workflow_id),
            "forked_from": forked_from(inp), **spend(row, fields.get("progress"))}
    return TaskState(**{**row.model_dump(), **told, **fields})


async def live_search_attributes(client: Client, seconds: float = TEMPORAL_ANSWER_S
                                 ) -> dict[str, tuple[str | None, int | None]] | None:
    """{workflow id: (RefloopStatus, RefloopTotalTokens)} of running workflows; None when
    Temporal is silent. Every status a workflow sets is told this way (waiting_approval,
    waiting_for_host, and any later one), so the list needs no list of statuses."""
    query = 'ExecutionStatus = "Running"'

    async def collect() -> dict[str, tuple[str | None, int | None]]:
        told = {}
        async for wf in client.list_workflows(query, limit=10_000):
            attrs = wf.typed_search_attributes
            told[wf.id] = (attrs.get(visibility.STATUS), attrs.get(visibility.TOTAL_TOKENS))
        return told

    try:
        return await within(collect(), seconds)
    except Exception:  # noqa: BLE001 (down, slow, or no visibility: the rows answer)
        return None


async def live_state(client: Client, store: Store, row: TaskRecord,
                     settings: Settings) -> TaskState:
    """The row with its workflow's progress; the stored row alone when Temporal is silent."""
    if row.status not in OPEN_STATUSES:
        return public(row, settings)

    review: dict[str, Any] = {}

    async def ask() -> tuple[TaskRecord, TaskProgress | None]:
        if row.kind == "code_review":  # its wait (its status) and its spend, as it tells them
            try:
                told = await client.get_workflow_handle(row.workflow_id).query(
                    CodeReviewWorkflow.status)
                review.update(budget=told.get("budget"), stage=told.get("stage"))
            except Exception:  # noqa: BLE001 (not picked up yet, or ended: its row says)
                pass
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
    # The workflow's word on a live status (waiting_approval is told only there)
    status = progress.status if progress is not None \
        and progress.status not in TERMINAL_STATUSES else fresh.status
    extra: dict[str, Any] = {}
    if review and fresh.status in OPEN_STATUSES:  # a running code review's word
        if review["stage"] in ("waiting_for_host", "waiting_for_budget"):
            status = review["stage"]
        if review["budget"] and (review["budget"]["max_cost_usd"] is not None
                                 or review["budget"]["max_tokens"] is not None):
            extra["budget"] = review["budget"]
        if review["budget"]:
            extra["cost_usd"] = extra["own_cost_usd"] = review["budget"]["cost_usd"]
    return public(fresh, settings, status=status, progress=progress, **extra)


class TaskFilters(BaseModel):
    """GET /tasks's filters; each one given must hold."""

    session_id: str | None = None
    status: str | None = None
    kind: str | None = None
    host: str | None = None
    model: str | None = None
    q: str | None = None  # words the task's text contains, any case
    limit: int = 100

    def stored_kind(self) -> str | None:
        if self.kind is None:
            return None
        return visibility.STORED_KINDS.get(self.kind, self.kind)

    def matches(self, state: TaskState) -> bool:
        if self.status is not None and state.status != self.status:
            return False
        if self.host is not None and state.host != self.host:
            return False
        if self.model is not None and state.model != self.model:
            return False
        text = " ".join(filter(None, [state.task, state.task_id, state.error])).lower()
        return all(word in text for word in (self.q or "").lower().split())


async def listed(client: Client, store: Store, settings: Settings,
                 filters: TaskFilters) -> list[TaskState]:
    """GET /tasks, newest first: stored rows with the live status Temporal tells for the
    running ones (waiting_approval lives only there), closed code reviews followed."""
    status = filters.status
    terminal = status in TERMINAL_STATUSES
    # Text, host and model are looked for in the stored input: read more rows to find them.
    scan = filters.limit if not (filters.q or filters.host or filters.model) else 2_000
    rows = await asyncio.to_thread(
        store.list_tasks, session_id=filters.session_id, status=status if terminal else None,
        limit=scan, kind=filters.stored_kind(), open_only=status is not None and not terminal)
    # One budget for the whole listing: Temporal silent, every row answers as stored.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TEMPORAL_ANSWER_S
    live: dict[str, tuple[str | None, int | None]] | None = {}
    if any(row.status in OPEN_STATUSES for row in rows):  # a review's waits are told too
        live = await live_search_attributes(client, TEMPORAL_ANSWER_S)
    silent = live is None
    states = []
    for row in rows:
        left = deadline - loop.time()
        if row.kind != "agent" and row.status in OPEN_STATUSES and not silent:
            try:  # nobody else updates code-review rows
                row = await within(refresh(client, store, row), max(left, 0.05))
            except Exception:  # noqa: BLE001 (Temporal silent: the row as stored)
                silent = True
        told_status, told_tokens = (live or {}).get(row.workflow_id, (None, None))
        fields: dict[str, Any] = {"from_database": silent}
        if row.status in OPEN_STATUSES and told_status \
                and told_status not in TERMINAL_STATUSES:
            fields["status"] = told_status  # the workflow's word, set before its row's
        if told_tokens is not None:
            fields["tokens"] = told_tokens
        state = public(row, settings, **fields)
        if filters.matches(state):
            states.append(state)
        if len(states) >= filters.limit:
            break
    return states
