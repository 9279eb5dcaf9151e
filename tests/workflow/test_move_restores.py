"""A host killed with kill -9 that never comes back: its task is moved to a host whose disk
never saw the workspace, at a path that does not exist there. The move puts the latest
checkpoint there first, and the task completes on the new host with the right files, each
edit applied once."""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest

from refloop.contract.task import TaskInput
from refloop.store import hosts as host_rows
from refloop.store.db import store_for
from refloop.worker.replay import dump_history
from tests.e2e.test_cli import refloop
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
    start,
    wait_until,
)
from tests.workflow.test_host_crash import kill, spawn_host

pytestmark = pytest.mark.slow


async def test_golden_a_dead_hosts_task_moves_to_an_empty_disk_and_completes_there(
        client, temporal_server, settings, scripted_llm, tmp_path, task_queue):
    names = {name: f"{name}-{uuid.uuid4().hex[:6]}" for name in ("a", "b")}
    roots = {name: tmp_path / f"{name}-root" for name in names}
    for root in roots.values():
        root.mkdir()
    old = roots["a"] / "ws"
    (old / "src").mkdir(parents=True)
    (old / "src" / "notes.md").write_text("line one\n")
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("str_replace_based_edit_tool")],
        "act": [call("str_replace_based_edit_tool", command="insert", path="src/notes.md",
                     insert_line=1, new_str="line two"),
                call("write_file", path="made.txt", content="made on a\n"),
                # host a is killed while the task waits on this call
                {**call("str_replace_based_edit_tool", command="insert", path="src/notes.md",
                        insert_line=2, new_str="line three"), "delay_ms": 3000},
                final("done")],
        "summary": [SUMMARY]}, repeat=True)
    store = store_for(settings.effective_database_url)
    host_a = spawn_host(temporal_server, settings, task_queue, names["a"], roots["a"],
                        tmp_path / "a-data")
    workers = [host_a]
    try:
        await wait_until(lambda: names["a"] in {h.host_id for h in host_rows.list_hosts(store)
                                                if h.live}, "host a registered", 60)
        handle = await start(client, task_queue, TaskInput(
            task="edit notes", workspace=str(old), model=model, host=names["a"],
            host_wait_s=2, enable_reflection=False))
        await wait_until(lambda: scripted_llm.arrived(model, "act") >= 3, "the slow call")
        kill(host_a)  # and its disk is gone with it

        async def waiting() -> bool:
            row = await asyncio.to_thread(store.get_task, handle.id)
            return row is not None and row.status == "waiting_for_host"

        workers.append(spawn_host(temporal_server, settings, task_queue, names["b"],
                                  roots["b"], tmp_path / "b-data"))
        await wait_until(waiting, "the task waiting for host a", 60)
        await wait_until(lambda: names["b"] in {h.host_id for h in host_rows.list_hosts(store)
                                                if h.live}, "host b registered", 60)
        new = roots["b"] / "moved" / "ws"  # nothing there: b never saw a's disk
        env = {"TEMPORAL_ADDRESS": temporal_server, "REFLOOP_TASK_QUEUE": task_queue,
               "DATABASE_URL": settings.effective_database_url, "COLUMNS": "400"}
        moved = await asyncio.to_thread(refloop, "move", handle.id, "--host", names["b"],
                                        "--workspace", str(new), tmp_path=tmp_path, **env)
        assert moved.returncode == 0, moved.stderr
        result = await asyncio.wait_for(result_of(handle), 90)
        if os.environ.get("REFLOOP_RECORD_HISTORIES"):  # `make histories`
            HISTORIES.mkdir(exist_ok=True)
            (HISTORIES / "agent_task_moved_and_restored.json").write_text(
                dump_history(await handle.fetch_history()))
    finally:
        for proc in workers:
            kill(proc)
        for host in names.values():
            host_rows.forget(store, host)
    assert result.status == "completed", result.answer
    assert (new / "src" / "notes.md").read_text() == "line one\nline two\nline three\n"
    assert (new / "made.txt").read_text() == "made on a\n"
    restored, = events_of(result, "workspace_restored")
    assert restored["written"] == 2 and restored["removed"] == 0
    assert events_of(result, "moved_to_host")[0]["to"] == names["b"]
