"""kill -9 of one host's worker: its task waits for the host (a state, not a failure), the
other host's task finishes meanwhile, and a new worker of the host finishes the task with
each edit applied once."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest

from refloop.contract.policies import HEARTBEAT
from refloop.contract.task import TaskInput
from refloop.store import hosts as host_rows
from refloop.store.db import store_for
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import (
    CODING,
    SUMMARY,
    call,
    events_of,
    final,
    plan_of,
    result_of,
    start,
    wait_until,
)

pytestmark = pytest.mark.slow
HOST_WAIT_S = 3


def spawn_host(temporal_server: str, settings, task_queue: str, host: str, root: Path,
               data: Path) -> subprocess.Popen:
    env = {**os.environ, "TEMPORAL_ADDRESS": temporal_server, "REFLOOP_TASK_QUEUE": task_queue,
           "OPENAI_BASE_URL": settings.openai_base_url, "OPENAI_API_KEY": "test",
           "DATABASE_URL": settings.database_url, "REFLOOP_DATA_DIR": str(data),
           "REFLOOP_HOST_ID": host, "REFLOOP_WORKSPACE_ROOTS": str(root),
           "REFLOOP_SEMANTIC_INDEX": "false", "REFLOOP_HOST_HEARTBEAT_S": "1"}
    return subprocess.Popen([sys.executable, "-m", "refloop", "worker"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


async def test_a_killed_hosts_task_waits_for_it_and_a_new_worker_finishes_it(
        client, temporal_server, settings, scripted_llm, tmp_path, task_queue):
    names = {name: f"{name}-{uuid.uuid4().hex[:6]}" for name in ("a", "b")}
    roots = {name: tmp_path / f"{name}-root" for name in names}
    for root in roots.values():
        (root / "ws").mkdir(parents=True)
    notes = roots["a"] / "ws" / "notes.md"
    notes.write_text("line one\n")
    model_a = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("str_replace_based_edit_tool")],
        "act": [call("str_replace_based_edit_tool", command="insert", path="notes.md",
                     insert_line=1, new_str="line two"),
                # host a's worker dies while the task waits on this call
                {**call("str_replace_based_edit_tool", command="insert", path="notes.md",
                        insert_line=2, new_str="line three"), "delay_ms": 3000},
                final("inserted twice")],
        "summary": [SUMMARY]}, repeat=True)
    model_b = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("read_file")],
        "act": [call("read_file", path="."), {**final("read"), "delay_ms": 2000}],
        "summary": [SUMMARY]}, repeat=True)
    (roots["b"] / "ws" / "b.txt").write_text("b\n")
    store = store_for(settings.effective_database_url)
    spawn = {name: (lambda name=name: spawn_host(temporal_server, settings, task_queue,
                                                 names[name], roots[name],
                                                 tmp_path / f"{name}-data"))
             for name in names}
    workers = {"a": spawn["a"](), "b": spawn["b"]()}
    extra: list[subprocess.Popen] = []
    try:
        await wait_until(lambda: {h.host_id for h in host_rows.list_hosts(store) if h.live}
                         >= set(names.values()), "both hosts registered", 60)
        handle_a = await start(client, task_queue, TaskInput(
            task="insert twice", workspace=str(roots["a"] / "ws"), model=model_a,
            host=names["a"], host_wait_s=HOST_WAIT_S, enable_reflection=False))
        await wait_until(lambda: scripted_llm.arrived(model_a, "act") >= 2, "the slow call")
        handle_b = await start(client, task_queue, TaskInput(
            task="read", workspace=str(roots["b"] / "ws"), model=model_b, host=names["b"],
            host_wait_s=HOST_WAIT_S, enable_reflection=False))
        kill(workers["a"])
        killed = time.time()

        async def waiting() -> bool:
            row = await asyncio.to_thread(store.get_task, handle_a.id)
            return row is not None and row.status == "waiting_for_host"

        await wait_until(waiting, "host a's task waiting for its host", 60)
        noticed_s = time.time() - killed
        result_b = await asyncio.wait_for(result_of(handle_b), 60)
        assert result_b.status == "completed", result_b.answer
        assert (await asyncio.to_thread(store.get_task, handle_a.id)).status == \
            "waiting_for_host"
        extra.append(spawn["a"]())
        result_a = await asyncio.wait_for(result_of(handle_a), 90)
    finally:
        for proc in [*workers.values(), *extra]:
            kill(proc)
        for host in names.values():
            host_rows.forget(store, host)
    assert result_a.status == "completed", result_a.answer
    assert notes.read_text() == "line one\nline two\nline three\n"  # each edit once
    waited, = events_of(result_a, "waiting_for_host")
    back, = events_of(result_a, "host_back")
    event = next(e for e in result_a.events if e.type == "waiting_for_host")
    shown_s = datetime.fromisoformat(event.ts).timestamp() - killed
    print(f"waiting_for_host {shown_s:.1f}s after the kill (row seen at {noticed_s:.1f}s, "
          f"bound {HOST_WAIT_S}s)")
    assert waited["activity"] == "refloop.tool.str_replace_based_edit_tool"
    # the killed call is seen gone at its heartbeat timeout, then waits the host's bound
    assert shown_s < HEARTBEAT.total_seconds() + HOST_WAIT_S + 10
