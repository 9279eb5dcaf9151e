"""`refloop up` as an operator runs it: killed mid-task and restarted, its dev server
orphaned and adopted or killed with it, found by other commands, never started twice."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from refloop.contract.task import TaskInput
from refloop.runtime.client import connect
from refloop.runtime.net import free_port
from refloop.worker.temporal_server import STATE_FILE, is_our_server
from refloop.workflows.agent import AgentTaskWorkflow
from tests.http_wait import wait_until_healthy
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import edit_and_wait_twice, result_of, wait_until


class Up:
    """One `refloop up` process on fixed ports and a data dir, logging to a file."""

    def __init__(self, tmp_path: Path, llm_url: str, **env: str) -> None:
        self.data_dir = tmp_path / "data"
        self.log = tmp_path / "up.log"
        self.api_port, self.temporal_port, self.ui_port = free_port(), free_port(), free_port()
        self.queue = f"up-{uuid.uuid4().hex[:6]}"
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("TEMPORAL_ADDRESS", "DATABASE_URL")}
        self.env.update({"REFLOOP_DATA_DIR": str(self.data_dir), "OPENAI_BASE_URL": llm_url,
                         "OPENAI_API_KEY": "test", "REFLOOP_TASK_QUEUE": self.queue,
                         "REFLOOP_TEMPORAL_PORT": str(self.temporal_port),
                         "REFLOOP_UI_PORT": str(self.ui_port),
                         "REFLOOP_SEMANTIC_INDEX": "false", **env})
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.temporal_port}"

    def start(self) -> None:
        with self.log.open("a") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "refloop", "up", "--port", str(self.api_port)],
                env=self.env, stdout=subprocess.DEVNULL, stderr=stderr,
                start_new_session=True)
        wait_until_healthy(f"http://127.0.0.1:{self.api_port}")

    def server_pid(self) -> int:
        return json.loads((self.data_dir / STATE_FILE).read_text())["pid"]

    def kill9(self) -> None:
        """kill -9 of `refloop up` and everything in its process group."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def terminate(self) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=40)

    def cleanup(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        record = self.data_dir / STATE_FILE
        if record.exists():
            pid = json.loads(record.read_text())["pid"]
            if is_our_server(pid, None):
                os.killpg(pid, signal.SIGKILL)


def refloop(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "refloop", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def read_until(process: subprocess.Popen[str], text: str) -> str:
    """stderr lines up to the first one holding `text` (or the end of the stream)."""
    assert process.stderr is not None
    lines = []
    for line in process.stderr:
        lines.append(line)
        if text in line:
            break
    return "".join(lines)


def dev_servers_on(db: Path) -> list[int]:
    """PIDs of `temporal server start-dev` processes on this SQLite file."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and is_our_server(int(proc.name), str(db.resolve())):
            pids.append(int(proc.name))
    return pids


@pytest.mark.slow
async def test_kill_9_of_refloop_up_mid_task_then_restart_completes_the_task(
        scripted_llm, tmp_path: Path):
    """Crash 1 kills `refloop up` only: its dev server lives on and the restart adopts it.
    Crash 2 kills `refloop up` and its server: the restart resumes from the SQLite file.
    Each edit made before a crash is applied once; no server is ever started twice."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    responses = edit_and_wait_twice(workspace)
    model = unique_scenario(scripted_llm, responses, repeat=True)
    up = Up(tmp_path, scripted_llm.base_url)
    db = up.data_dir / "temporal.db"
    try:
        up.start()
        first_server = up.server_pid()
        client = await connect(up.address, "default")
        handle = await client.start_workflow(
            AgentTaskWorkflow.run,
            TaskInput(task="edit then wait, twice", workspace=str(workspace), model=model,
                      enable_reflection=False),
            id=f"up-{uuid.uuid4().hex[:8]}", task_queue=up.queue)

        # Each crash lands in a slow model call: the 3rd act request, then the 6th.
        await wait_until(lambda: scripted_llm.arrived(model, "act") >= 3, "slow call 1")
        up.kill9()
        assert dev_servers_on(db) == [first_server]  # orphaned, still serving
        up.start()
        assert "adopted dev server left running by an earlier run" in up.log.read_text()
        assert up.server_pid() == first_server and dev_servers_on(db) == [first_server]

        await wait_until(lambda: scripted_llm.arrived(model, "act") >= 6, "slow call 2")
        up.kill9()
        os.killpg(first_server, signal.SIGKILL)  # the whole stack dies this time
        up.start()
        assert dev_servers_on(db) == [up.server_pid()] != [first_server]

        client = await connect(up.address, "default")
        result = await asyncio.wait_for(result_of(client.get_workflow_handle_for(
            AgentTaskWorkflow.run, handle.id)), 120)
        assert result.status == "completed", result.answer
        assert (workspace / "notes.md").read_text() == "line one\nline two\nline three\n"
        for purpose, scripted in responses.items():  # the two cut-off calls, asked again
            assert len(scripted_llm.requests(model=model, purpose=purpose)) == len(scripted) + (
                2 if purpose == "act" else 0)

        # Other commands find the running server without flags.
        history = tmp_path / "history.json"
        env = {k: v for k, v in up.env.items() if k != "REFLOOP_TEMPORAL_PORT"}
        done = refloop(env, "history", handle.id, "-o", str(history))
        assert done.returncode == 0, done.stderr
        replay = refloop(env, "replay", str(history))
        assert replay.returncode == 0, replay.stderr
        # ... and so does an extra worker.
        worker = subprocess.Popen(  # noqa: ASYNC220 (returns at once)
            [sys.executable, "-m", "refloop", "worker"], env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        started = await asyncio.to_thread(read_until, worker, "worker on ")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=20) == 143
        assert f"worker on {up.address}" in started, started + worker.stderr.read()

        server = up.server_pid()
        assert up.terminate() == 143
        assert dev_servers_on(db) == [] and not is_our_server(server, None)
        assert not (up.data_dir / STATE_FILE).exists()
        assert "Traceback" not in up.log.read_text()
    finally:
        up.cleanup()


async def test_refloop_up_never_joins_a_server_already_on_its_port(
        scripted_llm, temporal_server: str, tmp_path: Path):
    """A Temporal server of another data dir already answers on the port: `refloop up`
    never joins it (its tasks would land in that data dir's database); it runs its own on
    free ports, says so, and leaves the other one running when it stops."""
    taken = temporal_server.rpartition(":")[2]
    up = Up(tmp_path, scripted_llm.base_url, REFLOOP_TEMPORAL_PORT=taken)
    try:
        up.start()
        log = up.log.read_text()
        assert f"{temporal_server} serves another data dir" in log, log
        assert "never joined" in log and "attached to" not in log
        own = json.loads((up.data_dir / STATE_FILE).read_text())
        assert own["address"] != temporal_server and own["asked_port"] == int(taken)
        assert up.terminate() == 143
    finally:
        up.cleanup()
    client = await connect(temporal_server, "default")  # still serving
    assert await client.count_workflows() is not None
