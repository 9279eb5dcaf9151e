"""A move cannot run a command twice. A call scheduled while its task waits for its host is
claimed from the task by the host's worker before it runs: once the returning host has
claimed it, `refloop move` is refused (the call runs there, once); once a move has taken it
back, the old host's claim is refused (the call runs on the new host only)."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError

from refloop.contract import visibility
from refloop.contract.hosts import CLAIM_UPDATE, CallClaim, HostMove, needs_claim
from refloop.contract.task import TaskInput
from refloop.settings import Settings
from refloop.store import hosts as host_rows
from refloop.store.db import store_for
from refloop.worker.replay import dump_history
from refloop.workflows.agent import AgentTaskWorkflow
from tests.e2e.test_cli import refloop
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import HISTORIES, events_of, one_slow_command, result_of, wait_until
from tests.workflow.test_hosts import host_settings, running_host, unique_host
from tests.workflow.test_move_host import host_info

pytestmark = pytest.mark.slow

# The command appends its line, then runs on until the test lets it end: the move arrives
# while it runs, however slow the machine.
APPEND_THEN_RUN = "echo line >> log.txt\nwhile [ ! -f go ]; do sleep 0.1; done\n"


async def status_of(handle: WorkflowHandle) -> str | None:
    return (await handle.describe()).typed_search_attributes.get(visibility.STATUS)


async def pending_claim(handle: WorkflowHandle) -> str | None:
    """The activity id of the call waiting for its host, if it must be claimed."""
    pending = (await handle.describe()).raw_description.pending_activities
    return next((p.activity_id for p in pending if needs_claim(p.activity_id)), None)


async def start_append(client: Client, workspace: Path, host: str, model: str,
                       task_queue: str) -> WorkflowHandle:
    """The one-edit task both tests start on `host`, waiting at most 1 s for it."""
    return await client.start_workflow(
        AgentTaskWorkflow.run,
        TaskInput(task="append a line", workspace=str(workspace), host=host, host_wait_s=1,
                  enable_reflection=False, model=model),
        id=f"test-{uuid.uuid4().hex[:10]}", task_queue=task_queue)


def on_root(settings: Settings, tmp_path: Path, host: str, root: Path) -> Settings:
    """A host whose roots hold `root` (the same path on both hosts: a shared disk, so a
    command run on each would append twice to the same file)."""
    return host_settings(settings, tmp_path, host).model_copy(
        update={"refloop_workspace_roots": str(root)})


async def test_golden_a_command_started_by_its_returning_host_is_not_moved_and_runs_once(
        temporal_server, client, settings, scripted_llm, tmp_path, task_queue):
    back, other = unique_host("back"), unique_host("other")
    store = store_for(settings.effective_database_url)
    root = tmp_path / "shared-path"
    workspace = root / "ws"
    workspace.mkdir(parents=True)
    # The host beat once, long ago: known, not live, no worker yet.
    await asyncio.to_thread(host_rows.beat, store, back, [str(root)], [], "x@back", 0.01,
                            host_rows.utcnow())
    model = unique_scenario(scripted_llm, one_slow_command(workspace, APPEND_THEN_RUN))
    async with running_host(temporal_server, on_root(settings, tmp_path, other, root),
                            task_queue) as own:
        handle = await start_append(own, workspace, back, model, task_queue)

        async def waiting() -> bool:
            return await status_of(handle) == "waiting_for_host"

        await wait_until(waiting, "the command waiting for its host", 30)
        # A claim from a host the call did not go to, or for a call the task never
        # scheduled, is refused: nothing runs on its word.
        for claim in (CallClaim(activity_id=await pending_claim(handle) or "", host=other),
                      CallClaim(activity_id="claim-999", host=back)):
            with pytest.raises(WorkflowUpdateFailedError):
                await handle.execute_update(CLAIM_UPDATE, claim, result_type=str)
        log = workspace / "log.txt"
        async with running_host(temporal_server, on_root(settings, tmp_path, back, root),
                                task_queue):
            await wait_until(lambda: log.exists(), "the returning host running the command",
                             60)
            # The operator, not knowing the host came back, moves the task.
            env = {"TEMPORAL_ADDRESS": temporal_server, "REFLOOP_TASK_QUEUE": task_queue,
                   "DATABASE_URL": settings.effective_database_url, "COLUMNS": "400"}
            moved = await asyncio.to_thread(refloop, "move", handle.id, "--host", other,
                                            tmp_path=tmp_path, **env)
            (workspace / "go").touch()
            result = await asyncio.wait_for(result_of(handle), 60)
            history = await handle.fetch_history()
    if os.environ.get("REFLOOP_RECORD_HISTORIES"):  # `make histories`
        (HISTORIES / "agent_task_call_claimed_by_returning_host.json").write_text(
            dump_history(history))
    assert log.read_text() == "line\n"  # appended once
    assert moved.returncode != 0, moved.stderr
    assert f"host {back!r} is back and has started the call" in moved.stderr, moved.stderr
    assert result.status == "completed", result.answer
    assert not events_of(result, "moved_to_host")
    assert len(events_of(result, "host_back")) == 1


async def test_a_call_taken_back_by_a_move_is_refused_to_the_old_host(
        temporal_server, client, settings, scripted_llm, tmp_path, task_queue):
    """The other order: the move first. The call the old host would have run is refused to
    it (its claim fails), and the command runs on the new host only."""
    dead, live = unique_host("dead"), unique_host("live")
    store = store_for(settings.effective_database_url)
    root = tmp_path / "shared-path"
    workspace = root / "ws"
    workspace.mkdir(parents=True)
    await asyncio.to_thread(host_rows.beat, store, dead, [str(root)], [], "x@dead", 0.01,
                            host_rows.utcnow())
    model = unique_scenario(scripted_llm, one_slow_command(workspace, "echo line >> log.txt\n"))
    async with running_host(temporal_server, on_root(settings, tmp_path, live, root),
                            task_queue) as own:
        handle = await start_append(own, workspace, dead, model, task_queue)

        async def waiting_to_be_claimed() -> bool:
            return await pending_claim(handle) is not None

        await wait_until(waiting_to_be_claimed, "the command waiting for its host", 30)
        taken_back = await pending_claim(handle)
        assert taken_back is not None
        await handle.execute_update(AgentTaskWorkflow.move_to_host,
                                    HostMove(host=host_info(store, live)))
        # The old host comes back with the call in hand: its claim is refused.
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(CLAIM_UPDATE,
                                        CallClaim(activity_id=taken_back, host=dead),
                                        result_type=str)
        assert "taken back by a move" in str(refused.value.cause)
        result = await asyncio.wait_for(result_of(handle), 60)
    assert result.status == "completed", result.answer
    assert (workspace / "log.txt").read_text() == "line\n"
    assert events_of(result, "moved_to_host") == [{"from": dead, "to": live}]
