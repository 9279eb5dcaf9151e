"""Kill the worker process mid-task; a new worker finishes it without repeating work."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

from refloop.models import TaskInput
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
)
from workflows.agent import AgentTaskWorkflow


def spawn_worker(temporal_server: str, settings, task_queue: str) -> subprocess.Popen:
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": temporal_server,
        "REFLOOP_TASK_QUEUE": task_queue,
        "OPENAI_BASE_URL": settings.openai_base_url,
        "OPENAI_API_KEY": "test",
        "DATABASE_URL": settings.database_url,
        "REFLOOP_DATA_DIR": str(settings.refloop_data_dir),
        # The test server never moves a dead worker's sticky workflow tasks back to the
        # shared queue (a real server does after 5 s), so these workers run uncached.
        "REFLOOP_WORKER_MAX_CACHED_WORKFLOWS": "0",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "refloop", "worker"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


async def wait_for_event(handle, predicate, timeout_s: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        try:
            events = await handle.query(AgentTaskWorkflow.events, 0)
        except Exception:  # no worker has picked the workflow up yet
            events = []
        if any(predicate(event) for event in events):
            return
        await asyncio.sleep(0.2)
    raise AssertionError("event never appeared")


async def test_worker_killed_twice_mid_task_resumes_each_time(
    client, temporal_server, settings, scripted_llm, workspace, task_queue
):
    (workspace / "notes.md").write_text("line one\n")
    (workspace / "slow.sh").write_text("sleep 3\necho slept\n")
    responses = {
        "intent": [CODING],
        "plan": [plan_of("str_replace_based_edit_tool", "run_cmd")],
        "act": [
            call("str_replace_based_edit_tool", command="insert", path="notes.md",
                 insert_line=1, new_str="line two"),
            call("run_cmd", command="sh slow.sh"),
            call("str_replace_based_edit_tool", command="insert", path="notes.md",
                 insert_line=2, new_str="line three"),
            call("run_cmd", command="sh slow.sh"),
            final("inserted twice and slept twice"),
        ],
        "summary": [SUMMARY],
    }
    model = unique_scenario(scripted_llm, responses)
    workers = [spawn_worker(temporal_server, settings, task_queue)]
    try:
        handle = await start(client, task_queue, TaskInput(
            task="edit then wait, twice", workspace=str(workspace), model=model,
            enable_reflection=False))
        # kill -9 while each slow command runs; the edit before it has completed.
        for nth in (1, 2):
            await wait_for_event(handle, lambda e, nth=nth: e.type == "tool_call"
                                 and e.data["tool"] == "run_cmd"
                                 and e.data["iteration"] == 2 * nth)
            await asyncio.sleep(0.5)
            os.killpg(workers[-1].pid, signal.SIGKILL)
            workers[-1].wait()
            workers.append(spawn_worker(temporal_server, settings, task_queue))
        result = await asyncio.wait_for(result_of(handle), timeout=150)
    finally:
        for proc in workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    assert result.status == "completed", result.answer
    # Each edit made before a crash is applied exactly once.
    assert (workspace / "notes.md").read_text() == "line one\nline two\nline three\n"
    slept = [r for r in events_of(result, "tool_result") if r["tool"] == "run_cmd"]
    assert len(slept) == 2 and all(r["ok"] and "slept" in r["output"] for r in slept)
    # Every scripted answer was used exactly once: no completed model call was repeated.
    for purpose, scripted in responses.items():
        seen = scripted_llm.requests(model=model, purpose=purpose)
        assert len(seen) == len(scripted), purpose
        assert all(r["status"] == 200 for r in seen)
