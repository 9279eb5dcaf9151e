"""Many hosts, no shared disk: each task's workspace activities run on the worker of its
host; a host nobody serves is a state (`waiting_for_host`), and the task resumes when it is
back; a host the database does not know is waited for within the task's host bound, then
fails the task; one whose roots do not hold the workspace fails it at once."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowFailureError

from refloop.contract import visibility
from refloop.contract.hosts import host_queue
from refloop.contract.task import TaskInput
from refloop.runtime.client import connect
from refloop.settings import Settings
from refloop.store import hosts as host_rows
from refloop.store.db import store_for
from refloop.worker.main import build_worker
from refloop.worker.replay import dump_history
from refloop.workflows.agent import AgentTaskWorkflow
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import (
    CODING,
    HISTORIES,
    SUMMARY,
    call,
    events_of,
    final,
    plan_of,
    result_of,
    wait_until,
)

pytestmark = pytest.mark.slow


def host_settings(settings: Settings, tmp_path: Path, host: str) -> Settings:
    """A host of its own: id, data dir (journal, index) and workspace root."""
    root = tmp_path / f"{host}-root"
    root.mkdir(exist_ok=True)
    return settings.model_copy(update={
        "refloop_host_id": host, "refloop_data_dir": tmp_path / f"{host}-data",
        "refloop_workspace_roots": str(root)})


@contextlib.asynccontextmanager
async def running_host(temporal_server: str, settings: Settings, task_queue: str
                       ) -> AsyncIterator[Client]:
    """A worker for the host, on its own connection (one client polls a queue once)."""
    client = await connect(temporal_server, "default")
    store = store_for(settings.effective_database_url)
    try:
        async with build_worker(client, settings, task_queue, announce=True):
            yield client
    finally:
        await asyncio.to_thread(host_rows.forget, store, settings.refloop_host_id)


def unique_host(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:6]}"


@contextlib.asynccontextmanager
async def two_hosts(temporal_server: str, settings: Settings, tmp_path: Path, task_queue: str
                    ) -> AsyncIterator[list[str]]:
    """Hosts a and b, each with its own worker, data dir and root (`<host>-root`)."""
    hosts = [unique_host("a"), unique_host("b")]
    async with running_host(temporal_server, host_settings(settings, tmp_path, hosts[0]),
                            task_queue), \
            running_host(temporal_server, host_settings(settings, tmp_path, hosts[1]),
                         task_queue):
        yield hosts


def edit_scenario(path: str) -> dict:
    return {"intent": [CODING], "plan": [plan_of("write_file")],
            "act": [call("write_file", path=path, content="hi\n"), final("written")],
            "summary": [SUMMARY]}


def where_activities_ran(history) -> list[tuple[str, str, str]]:
    """(activity type, task queue, worker identity) of every started attempt."""
    scheduled = {e.event_id: e.activity_task_scheduled_event_attributes for e in history.events
                 if e.HasField("activity_task_scheduled_event_attributes")}
    ran = []
    for e in history.events:
        if e.HasField("activity_task_started_event_attributes"):
            started = e.activity_task_started_event_attributes
            attrs = scheduled[started.scheduled_event_id]
            ran.append((attrs.activity_type.name, attrs.task_queue.name, started.identity))
    return ran


async def test_golden_each_tasks_workspace_activities_run_on_its_hosts_worker(
        temporal_server, client, settings, scripted_llm, tmp_path, task_queue):
    async with two_hosts(temporal_server, settings, tmp_path, task_queue) as hosts:
        handles = {}
        for host in hosts:
            workspace = tmp_path / f"{host}-root" / "ws"
            workspace.mkdir()
            model = unique_scenario(scripted_llm, edit_scenario("out.txt"))
            handles[host] = await client.start_workflow(
                AgentTaskWorkflow.run, TaskInput(task="write out.txt", workspace=str(workspace),
                                                 model=model, host=host,
                                                 enable_reflection=False),
                id=f"test-{uuid.uuid4().hex[:10]}", task_queue=task_queue)
        results = {host: await result_of(handle) for host, handle in handles.items()}
    if os.environ.get("REFLOOP_RECORD_HISTORIES"):
        history = await handles[hosts[0]].fetch_history()
        (HISTORIES / "agent_task_on_its_host.json").write_text(dump_history(history))
    for host, handle in handles.items():
        assert results[host].status == "completed", results[host].answer
        assert (tmp_path / f"{host}-root" / "ws" / "out.txt").read_text() == "hi\n"
        ran = where_activities_ran(await handle.fetch_history())
        on_workspace = [r for r in ran if r[0].startswith(("refloop.tool.", "refloop.workspace."))]
        assert {r[0] for r in on_workspace} >= {"refloop.tool.write_file",
                                               "refloop.workspace.describe"}
        assert all(queue == host_queue(task_queue, host) and f"@{host} " in identity
                   for _, queue, identity in on_workspace), on_workspace
        # No fleet rate limit: model calls stay on the shared queue (eager dispatch).
        models = [r for r in ran if r[0].startswith("refloop.llm.")]
        assert models and all(queue == task_queue for _, queue, _ in models)


async def test_a_host_nobody_serves_is_waited_for_and_the_task_resumes(
        temporal_server, client, settings, scripted_llm, tmp_path, task_queue):
    """No worker of the host: `waiting_for_host` in the status, the search attribute, the
    row and the events; model calls of the task ran meanwhile. The host's worker comes and
    the task finishes; a second waiting task is cancelled while it waits."""
    serving, gone = unique_host("up"), unique_host("gone")
    gone_settings = host_settings(settings, tmp_path, gone)
    store = store_for(settings.effective_database_url)
    workspace = tmp_path / f"{gone}-root" / "ws"
    workspace.mkdir(parents=True)
    # The gone host is known (it beat once, long ago), but no worker of it runs.
    await asyncio.to_thread(host_rows.beat, store, gone, [str(workspace.parent)], [], "x@gone",
                            0.01, host_rows.utcnow())
    inputs = [TaskInput(task="write out.txt", workspace=str(workspace), host=gone,
                        host_wait_s=1, enable_reflection=False,
                        model=unique_scenario(scripted_llm, edit_scenario(name)))
              for name in ("out.txt", "never.txt")]
    async with running_host(temporal_server, host_settings(settings, tmp_path, serving),
                            task_queue) as own:
        handles = [await own.start_workflow(AgentTaskWorkflow.run, inp,
                                            id=f"test-{uuid.uuid4().hex[:10]}",
                                            task_queue=task_queue) for inp in inputs]

        async def waiting(handle) -> bool:
            attrs = (await handle.describe()).typed_search_attributes
            return attrs.get(visibility.STATUS) == "waiting_for_host"

        for handle in handles:
            await wait_until(lambda handle=handle: waiting(handle), "waiting_for_host", 30)
        row = store.get_task(handles[0].id)
        assert row.status == "waiting_for_host"
        progress = await handles[0].query(AgentTaskWorkflow.progress)
        assert progress.status == "waiting_for_host"
        await handles[1].cancel()
        with pytest.raises(WorkflowFailureError):
            await handles[1].result()
        async with running_host(temporal_server, gone_settings, task_queue):
            result = await asyncio.wait_for(result_of(handles[0]), 60)
    assert result.status == "completed", result.answer
    assert (workspace / "out.txt").read_text() == "hi\n"
    assert not (workspace / "never.txt").exists()
    waited, = events_of(result, "waiting_for_host")
    assert waited["host"] == gone and waited["activity"] == "refloop.tool.write_file"
    assert events_of(result, "host_back")
    assert store.get_task(handles[1].id).status == "cancelled"


async def test_golden_a_task_naming_a_host_before_it_registers_waits_for_it(
        temporal_server, client, settings, scripted_llm, tmp_path, task_queue):
    """Two workers, and a `temporal workflow start` naming host a a moment before a's
    worker registered: the task failed at once (`HostRefused: unknown host 'a'`). It now
    waits for a (`waiting_for_host`) and completes once a is up."""
    late = unique_host("late")
    config = host_settings(settings, tmp_path, late)
    workspace = tmp_path / f"{late}-root" / "ws"
    workspace.mkdir()
    model = unique_scenario(scripted_llm, edit_scenario("out.txt"))
    async with running_host(temporal_server, host_settings(settings, tmp_path,
                                                           unique_host("b")), task_queue):
        handle = await client.start_workflow(
            AgentTaskWorkflow.run, TaskInput(task="write out.txt", workspace=str(workspace),
                                             model=model, host=late, host_wait_s=30,
                                             enable_reflection=False),
            id=f"test-{uuid.uuid4().hex[:10]}", task_queue=task_queue)

        async def waiting() -> bool:
            attrs = (await handle.describe()).typed_search_attributes
            return attrs.get(visibility.STATUS) == "waiting_for_host"

        await wait_until(waiting, "waiting_for_host", 30)
        assert not scripted_llm.requests(model=model)  # nothing ran before its host came
        async with running_host(temporal_server, config, task_queue):
            result = await asyncio.wait_for(result_of(handle), 60)
    if os.environ.get("REFLOOP_RECORD_HISTORIES"):
        history = await handle.fetch_history()
        (HISTORIES / "agent_task_waited_for_unknown_host.json").write_text(
            dump_history(history))
    assert result.status == "completed", result.answer
    assert (workspace / "out.txt").read_text() == "hi\n"
    waited, = events_of(result, "waiting_for_host")
    assert waited["host"] == late and waited["activity"] == "refloop.hosts.check"
    assert events_of(result, "host_back")


async def test_an_unknown_host_fails_within_its_bound_one_not_holding_the_workspace_at_once(
        temporal_server, client, settings, scripted_llm, tmp_path, task_queue):
    host = unique_host("h")
    config = host_settings(settings, tmp_path, host)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    async with running_host(temporal_server, config, task_queue) as own:
        cases = {"nosuch-host": tmp_path / f"{host}-root", host: elsewhere}
        for named, workspace in cases.items():
            model = unique_scenario(scripted_llm, edit_scenario("x.txt"))
            started = time.monotonic()
            handle = await own.start_workflow(
                AgentTaskWorkflow.run, TaskInput(task="x", workspace=str(workspace), host=named,
                                                 model=model, enable_reflection=False,
                                                 host_wait_s=3),
                id=f"test-{uuid.uuid4().hex[:10]}", task_queue=task_queue)
            result = await result_of(handle)
            took = time.monotonic() - started
            assert result.status == "failed" and result.stop_reason == "host_refused"
            assert took < 12
            if named != host:  # a typo: waited for its bound, then the reason
                assert took >= 3 and "unknown host 'nosuch-host'" in result.answer
                assert events_of(result, "waiting_for_host")
            else:
                assert "does not hold" in result.answer
                assert not events_of(result, "waiting_for_host")
            assert not scripted_llm.requests(model=model)  # refused before any model call


async def test_a_worker_refuses_a_workspace_outside_its_roots(
        temporal_server, client, settings, scripted_llm, tmp_path, task_queue):
    """The database may say more than the worker: its own roots decide, non-retryable."""
    host = unique_host("strict")
    config = host_settings(settings, tmp_path, host).model_copy(
        update={"refloop_host_heartbeat_s": 600.0})  # its row stays as this test writes it
    outside = tmp_path / "outside"
    outside.mkdir()
    store = store_for(settings.effective_database_url)
    async with running_host(temporal_server, config, task_queue) as own:
        # A stale row claims wider roots than the worker has.
        await asyncio.to_thread(host_rows.beat, store, host, [str(tmp_path)], [], "x", 60.0,
                                host_rows.utcnow())
        model = unique_scenario(scripted_llm, edit_scenario("x.txt"))
        handle = await own.start_workflow(
            AgentTaskWorkflow.run, TaskInput(task="x", workspace=str(outside), host=host,
                                             model=model, enable_reflection=False),
            id=f"test-{uuid.uuid4().hex[:10]}", task_queue=task_queue)
        result = await asyncio.wait_for(result_of(handle), 60)
    assert result.status == "failed"
    assert "WorkspaceNotOnHost" in result.answer and f"not on host {host}" in result.answer
    assert not (outside / "x.txt").exists()
    ran = where_activities_ran(await handle.fetch_history())
    assert len([r for r in ran if r[0] == "refloop.tool.write_file"]) == 1  # not retried
