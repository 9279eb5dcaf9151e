"""Finding 7, thin clients that just work: a worker on a bare Temporal server registers
refloop's search attributes (a task started by the stock `temporal` CLI then runs), and
`refloop replay` takes the workflow ID from the history, not from the file's name."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from pathlib import Path

import pytest

from refloop.contract.visibility import SEARCH_ATTRIBUTES
from refloop.runtime.client import connect
from refloop.runtime.net import free_port
from refloop.worker.replay import replay_files
from refloop.worker.search_attributes import (
    SearchAttributesMissing,
    ensure_search_attributes,
    missing_attributes,
)
from refloop.worker.stack import embedded_stack
from refloop.worker.temporal_server import temporal_cli
from tests.e2e.test_temporal_cli import atemporal
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import CODING, SUMMARY, call, final, plan_of

HISTORIES = Path(__file__).parents[1] / "histories"


@pytest.fixture
async def bare_server(tmp_path):
    """A Temporal dev server without refloop's search attributes (as any other server)."""
    port = free_port()
    process = subprocess.Popen(  # noqa: ASYNC220 (returns at once; polled below)
        [temporal_cli(), "server", "start-dev", "--ip", "127.0.0.1", "--port", str(port),
         "--headless", "--log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    address = f"127.0.0.1:{port}"
    try:
        for _ in range(150):
            try:
                await connect(address, "default")
                break
            except Exception:  # noqa: BLE001 (not serving yet)
                await asyncio.sleep(0.2)
        yield address
    finally:
        process.terminate()
        process.wait(timeout=20)


async def test_a_task_started_by_the_stock_cli_runs_on_a_bare_server(
        bare_server, settings, scripted_llm, workspace, task_queue):
    client = await connect(bare_server, "default")
    assert await missing_attributes(client, "default")  # the server as the outsiders had it
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [call("write_file", path="a.txt", content="x"), final("written")],
        "summary": [SUMMARY]})
    ours = settings.model_copy(update={"temporal_address": bare_server,
                                       "refloop_task_queue": task_queue})
    workflow_id = f"cli-{uuid.uuid4().hex[:8]}"
    async with embedded_stack(ours) as stack:
        assert await missing_attributes(stack.client, "default") == []
        await atemporal(bare_server, "workflow", "start", "--type", "AgentTaskWorkflow",
                        "--task-queue", task_queue, "--workflow-id", workflow_id,
                        "--input", json.dumps({"task": "write a.txt", "model": model,
                                               "workspace": str(workspace),
                                               "enable_reflection": False}))
        result = await stack.client.get_workflow_handle(workflow_id).result()
    assert result["status"] == "completed"


async def test_replay_takes_the_workflow_id_from_the_history(tmp_path):
    """A parent with a supplement child, exported as the stock tools do (the ID in the
    started event, no refloop key) and saved as `parent.json`."""
    data = json.loads((HISTORIES / "agent_task_with_supplement.json").read_text())
    started = data["events"][0]["workflowExecutionStartedEventAttributes"]
    started["workflowId"] = data.pop("workflowId")
    saved = tmp_path / "parent.json"
    saved.write_text(json.dumps(data))
    assert await replay_files([saved]) == {}


async def test_a_server_that_refuses_the_attributes_stops_the_worker_with_the_commands(client):
    """Where the worker may not register them (here a namespace the server does not hold;
    on a managed server, no operator rights), it stops at once saying what to run."""
    names = list(SEARCH_ATTRIBUTES)
    with pytest.raises(SearchAttributesMissing) as refused:
        await ensure_search_attributes(client, "refloop-no-such-namespace")
    said = str(refused.value)
    assert "refloop-no-such-namespace" in said and "without them every task fails" in said
    for name in names:
        assert (f"temporal operator search-attribute create --namespace "
                f"refloop-no-such-namespace --name {name} --type "
                f"{SEARCH_ATTRIBUTES[name]}") in said
    assert isinstance(refused.value, SystemExit)  # the worker's start ends, no traceback
