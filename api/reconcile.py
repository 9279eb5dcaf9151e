"""Task rows kept truthful against Temporal.

A row that claims to run is checked against its workflow: at API start-up (all of them,
in the background) and whenever a route finds the workflow missing. A workflow that no
longer exists (an in-memory server restarted, a namespace wiped) makes its row `lost`,
with the reason. A closed workflow whose row never heard of it (code reviews record no row
themselves; a terminated agent task cannot) gets the workflow's own outcome.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from datetime import timedelta
from typing import TypeVar

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from refloop.contract.code_review import CodeReviewResult
from refloop.contract.task import RecordTaskInput, TaskResult
from refloop.store.db import TERMINAL_STATUSES, Store, TaskRecord, as_utc, utcnow

log = logging.getLogger("refloop.api")
T = TypeVar("T")
OPEN_STATUSES = ("queued", "running", "waiting_approval", "waiting_for_host",
                 "waiting_for_model", "waiting_for_budget", "handed_over")
# A row is written just before its workflow starts: a missing workflow only means "lost"
# once the row is older than this.
START_GRACE = timedelta(seconds=15)
CLOSED = {
    WorkflowExecutionStatus.FAILED: ("failed", "the workflow failed"),
    WorkflowExecutionStatus.CANCELED: ("cancelled", "the workflow was cancelled"),
    WorkflowExecutionStatus.TERMINATED: ("failed", "the workflow was terminated"),
    WorkflowExecutionStatus.TIMED_OUT: ("failed", "the workflow timed out"),
}


async def within(awaitable: Awaitable[T], seconds: float) -> T:
    """The awaitable's result, or TimeoutError after `seconds` at the latest. Unlike
    asyncio.wait_for it does not wait for the cancelled call to wind down: a Temporal call
    retrying against a dead server takes its time to notice."""
    task = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        task.cancel()
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # no warning
        raise TimeoutError(f"no answer within {seconds:g}s")
    return task.result()


def is_not_found(err: BaseException) -> bool:
    return isinstance(err, RPCError) and err.status == RPCStatusCode.NOT_FOUND


async def _record(store: Store, row: TaskRecord, status: str, *, error: str | None = None,
                  result: dict | None = None, usage: dict | None = None) -> TaskRecord:
    return await asyncio.to_thread(store.record_task, RecordTaskInput(
        task_id=row.task_id, workflow_id=row.workflow_id, kind=row.kind,
        session_id=row.session_id, status=status, error=error, result=result, usage=usage))


async def mark_lost(store: Store, row: TaskRecord, why: str) -> TaskRecord:
    log.warning("task %s is lost: %s", row.task_id, why)
    return await _record(store, row, "lost", error=why)


async def missing(store: Store, row: TaskRecord) -> TaskRecord:
    """A row whose workflow Temporal does not know. Still `queued`: its start failed or was
    cut short (nothing ever ran), so it failed; having run: its server lost it."""
    if row.status == "queued":
        return await _record(store, row, "failed", error=f"workflow {row.workflow_id} never "
                             "started (its start failed or was interrupted)")
    return await mark_lost(store, row, f"workflow {row.workflow_id} not found in Temporal "
                                       "(its server lost it: a wiped namespace or database)")


async def refresh(client: Client, store: Store, row: TaskRecord) -> TaskRecord:
    """The row, brought in line with its workflow (unchanged while it truly runs)."""
    if row.status in TERMINAL_STATUSES or row.status not in OPEN_STATUSES:
        return row
    handle = client.get_workflow_handle(row.workflow_id)
    try:
        description = await handle.describe()
    except RPCError as err:
        if not is_not_found(err) or utcnow() - as_utc(row.created_at) < START_GRACE:
            return row
        return await missing(store, row)
    status = description.status
    if status == WorkflowExecutionStatus.COMPLETED or status in CLOSED:
        stored = await asyncio.to_thread(store.get_task, row.task_id)
        if stored is not None and stored.status in TERMINAL_STATUSES:
            return stored  # the workflow's own record, written since `row` was read, says more
    if status == WorkflowExecutionStatus.COMPLETED:
        result_type = CodeReviewResult if row.kind == "code_review" else TaskResult
        try:
            result = await client.get_workflow_handle(
                row.workflow_id, result_type=result_type).result()
        except Exception as err:  # noqa: BLE001 (unreadable result: say so, never hang)
            return await _record(store, row, "failed", error=f"result unreadable: {err}")
        # A code review's usage and cost, where a task's stats keep them (GET /tasks shows it)
        usage = {"usage": result.usage.model_dump(mode="json")} \
            if isinstance(result, CodeReviewResult) else None
        return await _record(store, row, result.status, result=result.model_dump(mode="json"),
                             usage=usage)
    if status in CLOSED:
        new_status, why = CLOSED[status]
        return await _record(store, row, new_status, error=why)
    if row.kind != "agent" and row.status == "queued":  # agent rows say so themselves
        return await _record(store, row, "running")
    return row


async def reconcile_all(client: Client, store: Store) -> int:
    """Start-up pass over every open row; returns how many rows changed."""
    changed = 0
    try:
        for status in OPEN_STATUSES:
            rows = await asyncio.to_thread(store.list_tasks, status=status, limit=10_000)
            for row in rows:
                fresh = await refresh(client, store, row)
                changed += fresh.status != row.status
    except Exception:  # a start-up helper: logged, never fatal
        log.exception("reconciling task rows with Temporal failed")
    if changed:
        log.warning("reconciled %d task rows with Temporal", changed)
    return changed
