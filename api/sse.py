"""Server-Sent Events of a task's event list: resumable, no duplicates or gaps.

Events come from the workflow's `events` query while it runs, and from the stored result
once it has finished (the test server cannot query closed workflows after a restart). A
stream whose workflow cannot be queried checks the row against Temporal; a lost task, a
code review or a terminated workflow ends with a terminal event of the row's status.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from temporalio.client import Client

from refloop.api.reconcile import OPEN_STATUSES, refresh, within
from refloop.contract.task import Event
from refloop.contract.visibility import kind_name
from refloop.store.db import TERMINAL_STATUSES, Store, TaskRecord
from refloop.workflows.agent import AgentTaskWorkflow

FINAL_EVENTS = frozenset({"completed", "failed", "lost", "incomplete", "cancelled"})
POLL_S = 0.1
HEARTBEAT_S = 15.0
CHECK_S = 1.0  # how often a stream that cannot query its workflow asks Temporal about it
TEMPORAL_ANSWER_S = 1.5  # then the stream says Temporal is unreachable and keeps trying


def format_event(event: Event) -> str:
    return f"id: {event.seq}\nevent: {event.type}\ndata: {json.dumps(event.data)}\n\n"


def ending(row: TaskRecord, after: int) -> list[Event]:
    """The stored events after `after`, closed by a terminal event of the row's own status
    when the stored ones hold none (a lost task, a code review, a terminated workflow)."""
    stored = [Event.model_validate(e) for e in (row.result or {}).get("events", [])
              if isinstance(e, dict)] if row.kind == "agent" else []
    events = [e for e in stored if e.seq > after]
    if not any(e.type in FINAL_EVENTS for e in stored):
        seq = max([after, *(e.seq for e in stored)]) + 1
        stamp = row.finished_at or row.updated_at
        events.append(Event(seq=seq, type=row.status, ts=stamp.isoformat(), data={
            "status": row.status, "error": row.error, "kind": kind_name(row.kind)}))
    return events


async def fetch_events(client: Client, store: Store, task_id: str, workflow_id: str,
                       after: int, check: bool = True) -> tuple[list[Event], bool]:
    """(events after `after`, whether the task has ended)."""
    row = await asyncio.to_thread(store.get_task, task_id)
    if row is None:
        return [], True
    if row.status in TERMINAL_STATUSES or row.status not in OPEN_STATUSES:
        return ending(row, after), True  # any status but the open ones has ended
    if row.kind == "agent":
        try:
            handle = client.get_workflow_handle(workflow_id)
            events = await within(handle.query(AgentTaskWorkflow.events, after),
                                  TEMPORAL_ANSWER_S)
        except TimeoutError as err:
            raise TemporalSilent(row.status) from err
        except Exception:  # not started on a worker yet, just closed, or gone: check below
            pass
        else:
            # The workflow tells its end before its row says so: the end waits for the row,
            # so a reader who saw it never reads the task as still running.
            before_end = unrecorded_end(events)
            if before_end is None:
                return events, False
            if events[:before_end] or not check:
                return events[:before_end], False
    if check:
        try:
            fresh = await within(refresh(client, store, row), TEMPORAL_ANSWER_S)
        except TimeoutError as err:
            raise TemporalSilent(row.status) from err
        if fresh.status in TERMINAL_STATUSES:
            return ending(fresh, after), True
    return [], False


def unrecorded_end(events: list[Event]) -> int | None:
    """Index of the final event in a running row's live events, None when there is none."""
    return next((i for i, event in enumerate(events) if event.type in FINAL_EVENTS), None)


class TemporalSilent(Exception):
    """Temporal did not answer within TEMPORAL_ANSWER_S; the message is the row's status."""


def status_frame(status: str, **data: object) -> str:
    """A state change the event list does not carry as such (no `id`: resuming skips it)."""
    return f"event: status\ndata: {json.dumps({'status': status, **data})}\n\n"


# Events that change what the task is doing: the stream tells the new status.
STATUS_AFTER = {"approval_required": "waiting_approval", "approval_decided": "running",
                "waiting_for_model": "waiting_for_model", "model_back": "running",
                "waiting_for_budget": "waiting_for_budget", "budget_resumed": "running"}


async def live_status(client: Client, workflow_id: str) -> str | None:
    """The agent task's status as its workflow tells it now (waits included), or None."""
    try:
        handle = client.get_workflow_handle(workflow_id)
        progress = await within(handle.query(AgentTaskWorkflow.progress), TEMPORAL_ANSWER_S)
    except Exception:  # noqa: BLE001 (not queryable now: the caller keeps what it knew)
        return None
    return progress.status


async def event_stream(client: Client, store: Store, task_id: str, workflow_id: str,
                       after: int = 0) -> AsyncIterator[str]:
    loop = asyncio.get_running_loop()
    last_sent = last_check = loop.time()
    silent = False
    told: str | None = None  # the status this stream's events last implied
    while True:
        check = loop.time() - last_check >= CHECK_S
        if check:
            last_check = loop.time()
        try:
            events, ended = await fetch_events(client, store, task_id, workflow_id, after,
                                               check)
        except TemporalSilent as err:  # told once per outage; the stream keeps trying
            if not silent:
                silent = True
                # A wait the stream has seen begin is still the last thing known: the
                # stored row says only `running`.
                yield status_frame(told or str(err), temporal="unreachable",
                                   from_database=told is None)
                last_sent = loop.time()
            await asyncio.sleep(CHECK_S)
            continue
        if silent:
            silent = False
            # Back: the status the workflow tells now (it may have begun or ended a wait
            # while Temporal was away), never a guess.
            now = await live_status(client, workflow_id) or told or "running"
            yield status_frame(now, temporal="reachable")
        for event in events:
            yield format_event(event)
            after = event.seq
            last_sent = loop.time()
            if event.type in FINAL_EVENTS:
                return
            if event.type in STATUS_AFTER:
                told = STATUS_AFTER[event.type]
                yield status_frame(told)
        if ended:
            return
        if loop.time() - last_sent >= HEARTBEAT_S:
            yield ": keep-alive\n\n"
            last_sent = loop.time()
        await asyncio.sleep(POLL_S)
