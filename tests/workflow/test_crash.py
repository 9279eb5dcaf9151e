"""Kill the worker process mid-task; a new worker finishes it without repeating work, and
never runs a command a second time."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from refloop.contract.policies import HEARTBEAT
from refloop.contract.task import TaskInput
from refloop.worker.replay import dump_history
from refloop.workflows.agent import AgentTaskWorkflow
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import (
    CODING,
    HISTORIES,
    SUMMARY,
    activity_starts,
    call,
    edit_and_wait_twice,
    events_of,
    final,
    one_slow_command,
    plan_of,
    result_of,
    running,
    start,
    wait_until,
)

pytestmark = pytest.mark.slow  # each waits out heartbeat timeouts and worker starts


def spawn_worker(temporal_server: str, settings, task_queue: str,
                 log: Path | None = None,
                 extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": temporal_server,
        "REFLOOP_TASK_QUEUE": task_queue,
        "OPENAI_BASE_URL": settings.openai_base_url,
        "OPENAI_API_KEY": "test",
        "DATABASE_URL": settings.database_url,
        "REFLOOP_DATA_DIR": str(settings.refloop_data_dir),
        "REFLOOP_GRACEFUL_SHUTDOWN_S": "15",
        **(extra_env or {}),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "refloop", "worker"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("ab") if log else subprocess.DEVNULL,
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
    responses = edit_and_wait_twice(workspace)
    model = unique_scenario(scripted_llm, responses, repeat=True)
    workers = [spawn_worker(temporal_server, settings, task_queue)]
    try:
        handle = await start(client, task_queue, TaskInput(
            task="edit then wait, twice", workspace=str(workspace), model=model,
            enable_reflection=False))
        # kill -9 during each slow model call; the edit before it has completed.
        for nth in (1, 2):
            # The slow call is the model's 3rd act request, then its 6th (the 3rd again).
            await wait_until(lambda nth=nth: scripted_llm.arrived(model, "act") >= 3 * nth,
                             f"slow model call {nth}")
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
    reads = [r for r in events_of(result, "tool_result") if r["tool"] == "read_file"]
    assert len(reads) == 2 and all(r["ok"] for r in reads)
    # No completed model call was repeated: only the two cut off by a kill were asked again.
    for purpose, scripted in responses.items():
        seen = scripted_llm.requests(model=model, purpose=purpose)
        assert len(seen) == len(scripted) + (2 if purpose == "act" else 0), purpose
        assert all(r["status"] == 200 for r in seen)


async def test_a_killed_workers_call_is_retried_within_seconds(
    client, temporal_server, settings, scripted_llm, workspace, task_queue
):
    """The heartbeat timeout, not start-to-close, notices a dead worker: the model call it
    was waiting on starts again on a fresh worker seconds after the kill."""
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("read_file")],
        "act": [call("read_file", path="a.txt"), {**final("read"), "delay_ms": 2000}],
        "summary": [SUMMARY],
    }, repeat=True)
    (workspace / "a.txt").write_text("a\n")
    workers = [spawn_worker(temporal_server, settings, task_queue)]
    try:
        handle = await start(client, task_queue, TaskInput(
            task="read", workspace=str(workspace), model=model, enable_reflection=False))
        # The read is done; the second model call waits 2 s at the model.
        await wait_until(lambda: scripted_llm.arrived(model, "act") >= 2, "the 2 s call")
        workers.append(spawn_worker(temporal_server, settings, task_queue))
        killed_at = time.time()
        os.killpg(workers[0].pid, signal.SIGKILL)
        workers[0].wait()
        result = await asyncio.wait_for(result_of(handle), timeout=90)
    finally:
        for proc in workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert result.status == "completed", result.answer
    starts = activity_starts(await handle.fetch_history(), "refloop.llm.act")
    retried, = [e for n, e in starts
                if n == 1 and e.activity_task_started_event_attributes.attempt == 2]
    # The heartbeat timeout and 1 s back-off: the call starts again on the new worker.
    retry_s = retried.event_time.ToDatetime(tzinfo=UTC).timestamp() - killed_at
    completed, = [e for e in result.events if e.type == "completed"]
    # ... then the 2 s call, and the 3 s sticky timeout moves the workflow over.
    recovery_s = datetime.fromisoformat(completed.ts).timestamp() - killed_at
    print(f"retried {retry_s:.1f}s after the kill; the task ended at {recovery_s:.1f}s")
    # About 21 s and 26 s on a quiet machine; the bounds leave room for a loaded one and
    # stay far below the call's 30-minute start-to-close timeout, which would otherwise notice.
    heartbeat_s = HEARTBEAT.total_seconds()
    assert retry_s < heartbeat_s + 20 and recovery_s < heartbeat_s + 30, (retry_s, recovery_s)


async def test_sigterm_drains_the_running_call_then_the_next_worker_finishes(
    client, temporal_server, settings, scripted_llm, workspace, task_queue, tmp_path
):
    """SIGTERM (docker stop, systemd): the worker lets the call in flight finish within its
    grace period and exits 143; the task goes on on the next worker, nothing repeated."""
    responses = one_slow_command(workspace, "sleep 3\necho slept >> out.txt\n")
    model = unique_scenario(scripted_llm, responses)
    log = tmp_path / "worker.log"
    first = spawn_worker(temporal_server, settings, task_queue, log)
    workers = [first]
    try:
        handle = await start(client, task_queue, TaskInput(
            task="wait", workspace=str(workspace), model=model, enable_reflection=False))
        await wait_until(lambda: running(handle, "refloop.tool.run_cmd"), "run_cmd")
        signalled = time.monotonic()
        first.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(first.wait, 15 + 5)
        exited_s = time.monotonic() - signalled
        workers.append(spawn_worker(temporal_server, settings, task_queue))
        result = await asyncio.wait_for(result_of(handle), timeout=60)
    finally:
        for proc in workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert code == 143 and exited_s < 15 + 5, (code, exited_s, log.read_text())
    assert "Traceback" not in log.read_text()
    assert result.status == "completed", result.answer
    assert (workspace / "out.txt").read_text() == "slept\n"  # drained, never run twice
    for purpose, scripted in responses.items():
        assert len(scripted_llm.requests(model=model, purpose=purpose)) == len(scripted)


async def test_a_command_cut_off_by_a_crash_is_not_run_again(
    client, temporal_server, settings, scripted_llm, workspace, task_queue
):
    """run_cmd is neither idempotent nor journaled: one attempt. A worker killed mid-command
    is a clear tool error for the model; the next worker never runs the command again, and
    the task goes on."""
    responses = one_slow_command(workspace, "echo ran >> runs.txt\nsleep 3\necho slept\n")
    model = unique_scenario(scripted_llm, responses)
    workers = [spawn_worker(temporal_server, settings, task_queue)]
    try:
        handle = await start(client, task_queue, TaskInput(
            task="wait", workspace=str(workspace), model=model, enable_reflection=False))
        await wait_until((workspace / "runs.txt").exists, "the command's start")
        workers.append(spawn_worker(temporal_server, settings, task_queue))
        os.killpg(workers[0].pid, signal.SIGKILL)
        killed = time.monotonic()
        workers[0].wait()
        result = await asyncio.wait_for(result_of(handle), timeout=90)
        # The cut-off command's own sleep (3 s from its start, before the kill) has ended:
        # mostly so already, the result waiting out the heartbeat timeout.
        await asyncio.sleep(max(0.0, killed + 4 - time.monotonic()))
    finally:
        for proc in workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    history = await handle.fetch_history()
    if os.environ.get("REFLOOP_RECORD_HISTORIES"):
        (HISTORIES / "agent_task_interrupted_command.json").write_text(dump_history(history))
    assert result.status != "failed", result.answer  # one lost worker does not end the task
    cut_off, = events_of(result, "tool_result")
    assert cut_off["tool"] == "run_cmd" and not cut_off["ok"]
    assert cut_off["error"].startswith("E_INTERRUPTED: run_cmd did not finish")
    assert "not run again" in cut_off["error"]
    assert (workspace / "runs.txt").read_text() == "ran\n"
    starts = activity_starts(history, "refloop.tool.run_cmd")
    assert [(n, e.activity_task_started_event_attributes.attempt) for n, e in starts] == [(0, 1)]
    # The model was told, in its next turn, and answered.
    acts = scripted_llm.requests(model=model, purpose="act")
    assert len(acts) == 2 and "E_INTERRUPTED" in json.dumps(acts[1]["body"]["messages"])
    assert result.answer == "slept"
