"""`refloop rewind` on the real dev server: a running task goes back to a checkpoint; its
workspace is as it was after that call and the run goes on from there, so the files end
as a run that stopped there and then did the rest would leave them."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowFailureError

from refloop.checkpoints.rewind import run_checkpoints
from refloop.contract.task import TaskInput
from refloop.worker.main import build_worker
from refloop.workflows.agent import AgentTaskWorkflow
from tests.e2e.test_cli import refloop
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import CODING, SUMMARY, call, events_of, final, plan_of


def write(path: str, content: str, **extra) -> dict:
    return {**call("write_file", path=path, content=content), **extra}


async def checkpoints_taken(client: Client, workflow_id: str, count: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        history = await client.get_workflow_handle(workflow_id).fetch_history()
        if len(run_checkpoints(list(history.events))) >= count:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"{count} checkpoints were not taken within 60 s")


async def start_writing(client: Client, task_queue: str, workspace: Path, model: str) -> str:
    """A task that writes files, started; its workflow id."""
    workflow_id = f"test-{uuid.uuid4().hex[:10]}"
    await client.start_workflow(
        AgentTaskWorkflow.run, TaskInput(task="write files", workspace=str(workspace),
                                         model=model, enable_reflection=False),
        id=workflow_id, task_queue=task_queue)
    return workflow_id


async def test_a_running_task_rewound_to_step_two_goes_on_from_there(
        temporal_server, client, settings, scripted_llm, workspace, task_queue, tmp_path: Path):
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [write("a.txt", "first\n"), write("b.txt", "b\n"),
                write("a.txt", "third\n"), write("c.txt", "c\n"),
                write("d.txt", "d\n", delay_ms=60_000),  # the run is here when rewound
                write("e.txt", "e\n"),  # what the rewound run does next
                call("complete_step", step=1, summary="ok"), final("ok")],
        "summary": [SUMMARY],
    })
    async with build_worker(client, settings, task_queue):
        workflow_id = await start_writing(client, task_queue, workspace, model)
        await checkpoints_taken(client, workflow_id, 4)
        assert (workspace / "c.txt").exists()

        done = await asyncio.to_thread(
            refloop, "rewind", workflow_id, "--to-step", "2", tmp_path=tmp_path,
            TEMPORAL_ADDRESS=temporal_server, DATABASE_URL=settings.effective_database_url)
        assert done.returncode == 0, done.stderr
        assert "rewound to step 2" in done.stderr

        result = await client.get_workflow_handle_for(AgentTaskWorkflow.run,
                                                      workflow_id).result()

    assert result.status == "completed"
    assert sorted(p.name for p in workspace.iterdir()) == ["a.txt", "b.txt", "e.txt"]
    assert (workspace / "a.txt").read_text() == "first\n"
    restored = events_of(result, "workspace_restored")
    assert len(restored) == 1 and restored[0]["removed"] == 1  # c.txt
    assert events_of(result, "rewind")[0]["step"] == 2
    writes = [r["args"]["path"] for r in events_of(result, "tool_call")
              if r["tool"] == "write_file"]
    assert writes == ["a.txt", "b.txt", "e.txt"]  # the later calls are not in this run


async def test_rewinding_a_step_never_taken_or_a_task_that_ended_is_refused(
        temporal_server, client, settings, scripted_llm, workspace, task_queue, tmp_path: Path):
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [write("a.txt", "a\n"), write("b.txt", "b\n", delay_ms=60_000),
                call("complete_step", step=1, summary="ok"), final("ok")],
        "summary": [SUMMARY],
    })
    env = {"TEMPORAL_ADDRESS": temporal_server}
    async with build_worker(client, settings, task_queue):
        workflow_id = await start_writing(client, task_queue, workspace, model)
        handle = client.get_workflow_handle(workflow_id)
        await checkpoints_taken(client, workflow_id, 1)
        beyond = await asyncio.to_thread(refloop, "rewind", workflow_id, "--to-step", "5",
                                         tmp_path=tmp_path, **env)
        assert beyond.returncode == 2 and "no step 5" in beyond.stderr, beyond.stderr
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await handle.result()
    finished = await asyncio.to_thread(refloop, "rewind", workflow_id, "--to-step", "1",
                                       tmp_path=tmp_path, **env)
    assert finished.returncode == 2, finished.stderr
    said = " ".join(finished.stderr.split())  # the terminal's width wraps it
    assert "has ended (canceled): only a running task can be rewound" in said
    assert (workspace / "a.txt").read_text() == "a\n"  # nothing was put back or undone
