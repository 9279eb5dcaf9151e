"""A database slow to store a finished command's output is not a lost worker: the call keeps
beating while the output goes to the blob store, so the command is reported as it ran,
once, and never as interrupted."""

from __future__ import annotations

import asyncio
import threading

import pytest
from sqlalchemy import create_engine, text
from temporalio.api.enums.v1 import EventType

from refloop.contract.policies import HEARTBEAT
from refloop.contract.task import TaskInput
from refloop.worker.main import build_worker
from tests.constants import TEST_DATABASE_URL
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import events_of, one_slow_command, result_of, start, wait_until

pytestmark = [pytest.mark.db, pytest.mark.slow]

STALL_S = HEARTBEAT.total_seconds() + 3.0  # past the heartbeat timeout


def hold_the_blobs_table(locked: threading.Event, seconds: float) -> None:
    """A real stall: another transaction holds the blobs table, as a database under a
    migration or a vacuum would."""
    engine = create_engine(TEST_DATABASE_URL)
    try:
        with engine.begin() as conn:
            conn.execute(text("LOCK TABLE blobs IN ACCESS EXCLUSIVE MODE"))
            locked.set()
            conn.execute(text(f"SELECT pg_sleep({seconds})"))
    finally:
        engine.dispose()


async def test_a_stalled_blob_write_after_a_command_does_not_interrupt_it(
        client, settings, scripted_llm, workspace, task_queue):
    # The command prints more than the blob threshold: its output goes to the blob store
    # after it ran. It waits for the file `go` so the stall starts while it runs.
    script = "while [ ! -e go ]; do sleep 0.1; done\nseq 1 20000\n"
    model = unique_scenario(scripted_llm, one_slow_command(workspace, script))
    async with build_worker(client, settings, task_queue):
        handle = await start(client, task_queue, TaskInput(
            task="run it", workspace=str(workspace), model=model, enable_reflection=False))
        await wait_until(lambda: _has_tool_call(handle), "the command started")
        locked = threading.Event()
        holder = threading.Thread(target=hold_the_blobs_table, args=(locked, STALL_S))
        holder.start()
        await asyncio.to_thread(locked.wait, 10)
        (workspace / "go").write_text("")
        result = await asyncio.wait_for(result_of(handle), 120)
        holder.join()
        history = await handle.fetch_history()
    [ran] = [r for r in events_of(result, "tool_result") if r["tool"] == "run_cmd"]
    assert ran["ok"], ran["error"]
    attempts = [e.activity_task_started_event_attributes.attempt for e in history.events
                if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED]
    assert attempts and max(attempts) == 1  # no call was tried twice


async def _has_tool_call(handle) -> bool:
    from refloop.workflows.agent import AgentTaskWorkflow

    try:
        events = await handle.query(AgentTaskWorkflow.events, 0)
    except Exception:  # noqa: BLE001 - not picked up yet
        return False
    return any(e.type == "tool_call" for e in events)
