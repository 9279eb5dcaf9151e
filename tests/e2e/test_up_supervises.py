"""Finding 5: `refloop up` supervises its Temporal server. Killed under it, the server is
restarted on the same data dir (tasks go on); past the restart budget `refloop up` exits
non-zero saying why, instead of serving an API that answers for nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from pathlib import Path

import httpx
import pytest

from refloop.contract.task import TaskInput
from refloop.runtime.client import connect
from refloop.workflows.agent import AgentTaskWorkflow
from tests.e2e.test_up_restart import Up
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import CODING, SUMMARY, call, final, plan_of, result_of


async def wait_for(check, what: str, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := await asyncio.to_thread(check):
            return value
        await asyncio.sleep(0.3)
    raise AssertionError(f"never: {what}")


@pytest.mark.slow
async def test_a_killed_server_is_restarted_on_the_same_data_dir(scripted_llm, tmp_path: Path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    up = Up(tmp_path, scripted_llm.base_url, REFLOOP_SEMANTIC_INDEX="false",
            REFLOOP_ENVIRONMENT_PROBE_SECRET="sk-never-in-the-server")
    try:
        up.start()
        first = up.server_pid()
        environ = await asyncio.to_thread(Path(f"/proc/{first}/environ").read_bytes)
        assert b"sk-never-in-the-server" not in environ  # a scrubbed environment
        os.kill(first, signal.SIGKILL)
        await wait_for(lambda: "restarting it on the same data dir" in up.log.read_text(),
                       "the restart is logged")
        # What happened, not "exited (code 0)" (its status was reaped, then read as 0).
        assert f"(PID {first}) was killed by SIGKILL; restarting" in up.log.read_text()
        second = await wait_for(lambda: (pid := up.server_pid()) != first and pid,
                                "a new server")
        assert second != first and up.process.poll() is None

        def healthy() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{up.api_port}/healthz",
                                 timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        await wait_for(healthy, "healthz ok again")
        model = unique_scenario(scripted_llm, {
            "intent": [CODING], "plan": [plan_of("write_file")],
            "act": [call("write_file", path="a.txt", content="x"), final("written")],
            "summary": [SUMMARY]})
        client = await connect(up.address, "default")
        handle = await client.start_workflow(
            AgentTaskWorkflow.run, TaskInput(task="write a.txt", workspace=str(workspace),
                                             model=model, enable_reflection=False),
            id=f"sup-{uuid.uuid4().hex[:8]}", task_queue=up.queue)
        assert (await asyncio.wait_for(result_of(handle), 60)).status == "completed"
    finally:
        up.cleanup()


@pytest.mark.slow
async def test_past_the_restart_budget_up_exits_non_zero(scripted_llm, tmp_path: Path):
    up = Up(tmp_path, scripted_llm.base_url, REFLOOP_TEMPORAL_RESTARTS="0")
    try:
        up.start()
        os.kill(up.server_pid(), signal.SIGKILL)
        code = await asyncio.to_thread(up.process.wait, 60)
        assert code == 3
        log = up.log.read_text()
        assert "giving up" in log and "was killed by SIGKILL" in log
        assert "Traceback" not in log and "CancelledError" not in log  # a graceful stop
    finally:
        up.cleanup()


@pytest.mark.slow
async def test_run_beside_up_never_names_a_model_it_does_not_use(scripted_llm,
                                                                 tmp_path: Path):
    """`refloop run` while `refloop up` serves the same data dir: `up`'s worker takes the
    task's calls, with `up`'s model; the run says so instead of "model: SCRIPTED"."""
    import subprocess
    import sys

    workspace = tmp_path / "ws"
    workspace.mkdir()
    up = Up(tmp_path, scripted_llm.base_url)
    try:
        up.start()
        env = {k: v for k, v in up.env.items() if k != "OPENAI_BASE_URL"}  # run: scripted
        done = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "refloop", "run", "say hello",
                             "--workspace", str(workspace), "--no-reflection"],
            env=env, capture_output=True, text=True, timeout=120)
        assert "model: SCRIPTED" not in done.stderr, done.stderr
        assert "run this task with their own model settings" in " ".join(done.stderr.split())
    finally:
        up.cleanup()


@pytest.mark.slow
async def test_up_on_a_taken_api_port_says_so_before_any_banner(scripted_llm, tmp_path: Path):
    """The ready banner came first, then the bind failed: now the bind comes first."""
    import socket
    import subprocess
    import sys

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        up = Up(tmp_path, scripted_llm.base_url)
        done = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "refloop", "up", "--port", str(port)],
            env=up.env, capture_output=True, text=True, timeout=120)
    err = " ".join(done.stderr.split())
    assert done.returncode == 2, err[-2000:]
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in err
    assert "refloop up:" in err and "Ctrl-C to stop" not in err and "Traceback" not in err
