"""Server-Sent Events of a task's event list: resumable, no duplicates or gaps.

Events come from the workflow's `events` query while it runs, and from the stored result
once it has finished (the test server cannot query closed workflows after a restart).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from temporalio.client import Client

from refloop.models import Event
from refloop.store import TERMINAL_STATUSES, Store
from workflows.agent import AgentTaskWorkflow

FINAL_EVENTS = frozenset({"completed", "failed"})
POLL_S = 0.1
HEARTBEAT_S = 15.0


def format_event(event: Event) -> str:
    return f"id: {event.seq}\nevent: {event.type}\ndata: {json.dumps(event.data)}\n\n"


async def fetch_events(client: Client, store: Store, task_id: str, workflow_id: str,
                       after: int) -> tuple[list[Event], bool]:
    """(events after `after`, whether the task has ended)."""
    row = await asyncio.to_thread(store.get_task, task_id)
    if row is not None and row.status in TERMINAL_STATUSES and row.result:
        stored = [Event.model_validate(e) for e in row.result.get("events", [])]
        return [e for e in stored if e.seq > after], True
    try:
        handle = client.get_workflow_handle(workflow_id)
        return await handle.query(AgentTaskWorkflow.events, after), False
    except Exception:  # not started on a worker yet, or just closed: try again shortly
        return [], False


async def event_stream(client: Client, store: Store, task_id: str, workflow_id: str,
                       after: int = 0) -> AsyncIterator[str]:
    loop = asyncio.get_running_loop()
    last_sent = loop.time()
    while True:
        events, ended = await fetch_events(client, store, task_id, workflow_id, after)
        for event in events:
            yield format_event(event)
            after = event.seq
            last_sent = loop.time()
            if event.type in FINAL_EVENTS:
                return
        if ended:
            return
        if loop.time() - last_sent >= HEARTBEAT_S:
            yield ": keep-alive\n\n"
            last_sent = loop.time()
        await asyncio.sleep(POLL_S)
