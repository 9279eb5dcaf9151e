"""Moving a task whose host will never return: the `move_to_host` update (and
`refloop move`) sends the call it waits on to another live host whose roots hold its
workspace; the validator refuses anything else."""

from __future__ import annotations

import asyncio
import shutil
import uuid

import pytest
from temporalio.client import WorkflowUpdateFailedError

from refloop.contract import visibility
from refloop.contract.hosts import HostMove
from refloop.contract.task import TaskInput
from refloop.store import hosts as host_rows
from refloop.store.db import store_for
from refloop.workflows.agent import AgentTaskWorkflow
from tests.e2e.test_cli import refloop
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import events_of, result_of, wait_until
from tests.workflow.test_hosts import (
    edit_scenario,
    host_settings,
    running_host,
    unique_host,
    where_activities_ran,
)

pytestmark = pytest.mark.slow


def host_info(store, host: str):
    return next(h for h in host_rows.list_hosts(store) if h.host_id == host)


async def waiting_task(own, scripted_llm, workspace, dead: str, task_queue: str):
    """A task writing out.txt for the dead host, once it shows `waiting_for_host`."""
    model = unique_scenario(scripted_llm, edit_scenario("out.txt"))
    handle = await own.start_workflow(
        AgentTaskWorkflow.run,
        TaskInput(task="write out.txt", workspace=str(workspace), host=dead, host_wait_s=1,
                  enable_reflection=False, model=model),
        id=f"test-{uuid.uuid4().hex[:10]}", task_queue=task_queue)

    async def waiting() -> bool:
        attrs = (await handle.describe()).typed_search_attributes
        return attrs.get(visibility.STATUS) == "waiting_for_host"

    await wait_until(waiting, "waiting_for_host", 30)
    return handle


async def test_a_task_waiting_on_a_dead_host_is_moved_to_a_live_one_and_completes(
        temporal_server, client, settings, scripted_llm, tmp_path, task_queue):
    dead, live = unique_host("dead"), unique_host("live")
    store = store_for(settings.effective_database_url)
    root = tmp_path / "shared-path"  # the workspace, copied to the live host at this path
    workspace = root / "ws"
    workspace.mkdir(parents=True)
    # The dead host beat once, long ago: known, not live, no worker.
    await asyncio.to_thread(host_rows.beat, store, dead, [str(root)], [], "x@dead", 0.01,
                            host_rows.utcnow())
    live_settings = host_settings(settings, tmp_path, live).model_copy(
        update={"refloop_workspace_roots": str(root)})
    other = unique_host("other")  # live, but its roots do not hold the workspace
    async with running_host(temporal_server, live_settings, task_queue) as own, \
            running_host(temporal_server, host_settings(settings, tmp_path, other), task_queue):
        handle = await waiting_task(own, scripted_llm, workspace, dead, task_queue)
        # The validator: a host not live, or one whose roots do not hold the workspace.
        for target, why in ((dead, "already on host"), (other, "does not hold")):
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await handle.execute_update(AgentTaskWorkflow.move_to_host,
                                            HostMove(host=host_info(store, target)))
            assert why in str(refused.value.cause), refused.value.cause
        gone = host_info(store, dead).model_copy(update={"host_id": "nobody", "live": False})
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(AgentTaskWorkflow.move_to_host, HostMove(host=gone))
        assert "not live" in str(refused.value.cause)
        # The operator's command: a 10-minute wait bound would not delay it.
        env = {"TEMPORAL_ADDRESS": temporal_server, "REFLOOP_TASK_QUEUE": task_queue,
               "DATABASE_URL": settings.effective_database_url, "COLUMNS": "400"}
        moved = await asyncio.to_thread(refloop, "move", handle.id, "--host", live,
                                        tmp_path=tmp_path, **env)
        assert moved.returncode == 0, moved.stderr
        assert f"moved from {dead} to {live}" in moved.stderr
        result = await asyncio.wait_for(result_of(handle), 60)
        again = await asyncio.to_thread(refloop, "move", handle.id, "--host", other,
                                        tmp_path=tmp_path, **env)
    assert result.status == "completed", result.answer
    assert (workspace / "out.txt").read_text() == "hi\n"
    assert events_of(result, "moved_to_host") == [{"from": dead, "to": live}]
    # The move ended the wait: no "host is back" for a host that never came back
    assert not events_of(result, "host_back") and result.stats.host_wait_s > 0
    row = store.get_task(handle.id)
    assert row.input["host"] == live and row.waiting is None  # the row names the new host
    writes = [r for r in where_activities_ran(await handle.fetch_history())
              if r[0] == "refloop.tool.write_file"]
    assert len(writes) == 1 and f"@{live} " in writes[0][2]  # applied once, on the live host
    assert again.returncode == 2 and "does not hold" in again.stderr, again.stderr


async def test_only_a_task_waiting_for_its_host_can_be_moved(
        temporal_server, client, settings, scripted_llm, tmp_path, task_queue):
    host = unique_host("h")
    config = host_settings(settings, tmp_path, host)
    store = store_for(settings.effective_database_url)
    workspace = tmp_path / f"{host}-root" / "ws"
    workspace.mkdir(parents=True)
    async with running_host(temporal_server, config, task_queue) as own:
        model = unique_scenario(scripted_llm, {"intent": [{"delay_ms": 20000, "json": {
            "intent": "CODING_TASK", "confidence": 0.9, "reason": "x"}}]})
        handle = await own.start_workflow(
            AgentTaskWorkflow.run, TaskInput(task="x", workspace=str(workspace), host=host,
                                             model=model, enable_reflection=False),
            id=f"test-{uuid.uuid4().hex[:10]}", task_queue=task_queue)
        target = host_info(store, host).model_copy(update={"host_id": "elsewhere"})
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(AgentTaskWorkflow.move_to_host, HostMove(host=target))
        assert "not waiting_for_host" in str(refused.value.cause)
        await handle.terminate()


async def test_a_task_is_moved_to_a_copy_of_its_workspace_at_another_path(
        temporal_server, client, settings, scripted_llm, tmp_path, task_queue):
    """Moving needed the same absolute path on the new host (and a restart of that host to
    add it to its roots). `refloop move TASK --host H --workspace PATH`: the call the task
    waits on, and every one after it, runs on H in the copy at PATH."""
    dead, live = unique_host("dead"), unique_host("live")
    store = store_for(settings.effective_database_url)
    old_root = tmp_path / "old-disk"
    workspace = old_root / "ws"
    workspace.mkdir(parents=True)
    (workspace / "notes.txt").write_text("kept\n")
    await asyncio.to_thread(host_rows.beat, store, dead, [str(old_root)], [], "x@dead", 0.01,
                            host_rows.utcnow())
    live_settings = host_settings(settings, tmp_path, live)
    copy = tmp_path / f"{live}-root" / "restored" / "ws"
    async with running_host(temporal_server, live_settings, task_queue) as own:
        handle = await waiting_task(own, scripted_llm, workspace, dead, task_queue)
        copy.parent.mkdir(parents=True)
        shutil.copytree(workspace, copy)  # the operator's copy, at a path of its own
        env = {"TEMPORAL_ADDRESS": temporal_server, "REFLOOP_TASK_QUEUE": task_queue,
               "DATABASE_URL": settings.effective_database_url, "COLUMNS": "400"}
        moved = await asyncio.to_thread(refloop, "move", handle.id, "--host", live,
                                        "--workspace", str(copy), tmp_path=tmp_path, **env)
        assert moved.returncode == 0, moved.stderr
        assert f"its workspace at {copy}" in moved.stderr
        result = await asyncio.wait_for(result_of(handle), 60)
    assert result.status == "completed", result.answer
    assert (copy / "out.txt").read_text() == "hi\n" and (copy / "notes.txt").exists()
    assert not (workspace / "out.txt").exists()
    assert events_of(result, "moved_to_host") == [{"from": dead, "to": live,
                                                   "workspace": str(copy)}]
