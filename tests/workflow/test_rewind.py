"""`refloop rewind` on the real dev server: a running task goes back to a checkpoint inside
its run (an update): its workspace, conversation and progress as they were after that call,
together, and it goes on from there. Refused or failed, nothing changes; Temporal going
silent meanwhile never makes the answer a guess."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import Client, WorkflowFailureError

from refloop.api import branching
from refloop.checkpoints.rewind import run_checkpoints
from refloop.contract import activity_calls
from refloop.contract.task import TaskInput
from refloop.runtime.client import connect
from refloop.store.db import store_for
from refloop.worker.main import build_worker
from refloop.worker.replay import dump_history
from refloop.workflows.agent import AgentTaskWorkflow
from tests.e2e.test_cli import refloop
from tests.llm_fixtures import unique_scenario
from tests.proxy import DatabaseProxy
from tests.workflow.helpers import (
    CODING,
    HISTORIES,
    SUMMARY,
    call,
    events_of,
    final,
    plan_of,
    wait_until,
)

UNDO = {"command": "undo_edit"}


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


async def model_turn_running(client: Client, workflow_id: str) -> bool:
    """Whether a worker runs the task's model turn now (the server lists it pending)."""
    described = await client.get_workflow_handle(workflow_id).describe()
    return any(pending.activity_type.name == activity_calls.ACT.name
               and pending.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
               for pending in described.raw_description.pending_activities)


async def start_writing(client: Client, task_queue: str, workspace: Path, model: str,
                        **overrides) -> str:
    """A task that writes files, started; its workflow id."""
    workflow_id = f"test-{uuid.uuid4().hex[:10]}"
    await client.start_workflow(
        AgentTaskWorkflow.run, TaskInput(task="write files", workspace=str(workspace),
                                         model=model, enable_reflection=False, **overrides),
        id=workflow_id, task_queue=task_queue)
    return workflow_id


async def test_golden_a_running_task_rewound_to_step_two_goes_on_from_there(
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
        handle = client.get_workflow_handle(workflow_id)
        first_run = (await handle.describe()).run_id
        await checkpoints_taken(client, workflow_id, 4)
        assert (workspace / "c.txt").exists()

        started = time.monotonic()
        done = await asyncio.to_thread(
            refloop, "rewind", workflow_id, "--to-step", "2", tmp_path=tmp_path,
            TEMPORAL_ADDRESS=temporal_server, DATABASE_URL=settings.effective_database_url)
        assert done.returncode == 0, done.stderr
        said = " ".join(done.stderr.split())
        assert "rewound to step 2" in said and "2 later edits taken back" in said
        # the model turn in flight (60 s) was taken back, not waited for
        assert time.monotonic() - started < 30

        result = await client.get_workflow_handle_for(AgentTaskWorkflow.run,
                                                      workflow_id).result()
        history = await handle.fetch_history()

    assert result.status == "completed"
    assert (await handle.describe()).run_id == first_run  # one run: nothing was reset
    assert sorted(p.name for p in workspace.iterdir()) == ["a.txt", "b.txt", "e.txt"]
    assert (workspace / "a.txt").read_text() == "first\n"
    rewound = events_of(result, "rewound")
    assert len(rewound) == 1 and rewound[0]["step"] == 2
    assert rewound[0]["removed"] == 1 and rewound[0]["written"] == 1  # c.txt; a.txt back
    assert rewound[0]["edits_taken_back"] == 2
    assert [e["step"] for e in events_of(result, "rewind")] == [2]
    seqs = [event.seq for event in result.events]
    assert seqs == sorted(set(seqs))  # the numbering goes on
    # The run's checkpoints as the rewind left them: the ones a later rewind or fork names
    names = [p.call_id.rsplit(".", 2)[-2:] for p in run_checkpoints(list(history.events))]
    assert len(names) == 3
    assert result.stats.rewound_usage.calls == 2  # the turns that wrote a.txt and c.txt
    if os.environ.get("REFLOOP_RECORD_HISTORIES"):
        (HISTORIES / "agent_task_rewound.json").write_text(dump_history(history))


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


async def test_an_undo_after_a_rewind_never_undoes_a_call_the_rewind_took_back(
        client, settings, scripted_llm, workspace, task_queue):
    edit = "str_replace_based_edit_tool"
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [write("a.txt", "one\n"), call(edit, command="str_replace", path="a.txt",
                                              old_str="one", new_str="two"),
                write("b.txt", "b\n", delay_ms=60_000),  # in flight when rewound
                call(edit, command="undo_edit", path="a.txt"),  # after the rewind
                call("complete_step", step=1, summary="ok"), final("ok")],
        "summary": [SUMMARY],
    })
    async with build_worker(client, settings, task_queue):
        workflow_id = await start_writing(client, task_queue, workspace, model)
        await checkpoints_taken(client, workflow_id, 2)
        done = await branching.rewind(client, workflow_id, 1)
        assert done.edits_taken_back == 1 and done.step == 1
        result = await client.get_workflow_handle_for(AgentTaskWorkflow.run,
                                                      workflow_id).result()
    assert result.status == "completed"
    undo = [r for r in events_of(result, "tool_result") if r["tool"] == edit][-1]
    # The edit to "two" is gone with the rewind: the undo undoes the write that made
    # a.txt, not that edit (whose pre-image "one" would have come back)
    assert undo["ok"] and not (workspace / "a.txt").exists()


async def test_a_rewind_whose_restore_fails_changes_nothing_and_the_task_goes_on(
        client, settings, scripted_llm, workspace, task_queue):
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [write("a.txt", "a\n"), write("b.txt", "b\n"),
                write("c.txt", "c\n", delay_ms=60_000),  # in flight when rewound
                write("d.txt", "d\n"), call("complete_step", step=1, summary="ok"),
                final("ok")],
        "summary": [SUMMARY],
    })
    async with build_worker(client, settings, task_queue):
        workflow_id = await start_writing(client, task_queue, workspace, model)
        await checkpoints_taken(client, workflow_id, 2)
        history = await client.get_workflow_handle(workflow_id).fetch_history()
        lost = run_checkpoints(list(history.events))[0].checkpoint_id
        engine = create_engine(settings.effective_database_url)
        with engine.begin() as db:  # step 1's checkpoint is gone from the store
            db.execute(text("DELETE FROM checkpoint_objects WHERE key = :key"), {"key": lost})
        engine.dispose()
        with pytest.raises(branching.BranchRefused,
                           match="could not be put back.*it is as it was"):
            await branching.rewind(client, workflow_id, 1)
        assert sorted(p.name for p in workspace.iterdir()) == ["a.txt", "b.txt"]
        result = await client.get_workflow_handle_for(AgentTaskWorkflow.run,
                                                      workflow_id).result()
    assert result.status == "completed"
    assert sorted(p.name for p in workspace.iterdir()) == ["a.txt", "b.txt", "d.txt"]
    assert [e["step"] for e in events_of(result, "rewind_failed")] == [1]
    assert not events_of(result, "rewound")
    assert result.stats.rewound_usage.calls == 0


async def test_a_rewind_answered_through_a_temporal_outage_is_reported_as_it_happened(
        temporal_server, client, settings, scripted_llm, workspace, task_queue):
    """Temporal silent for 3 s while the rewind waits for the task's running command: the
    same update is asked again, and the answer is the rewind's own (it happened)."""
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [write("a.txt", "a\n"), write("b.txt", "b\n"),
                call("run_cmd", command="sleep 6"),  # the rewind waits for it to end
                write("c.txt", "c\n"), call("complete_step", step=1, summary="ok"),
                final("ok")],
        "summary": [SUMMARY],
    })
    proxy = DatabaseProxy(target_port=int(temporal_server.rsplit(":", 1)[1]))
    await proxy.start()
    async with build_worker(client, settings, task_queue):
        workflow_id = await start_writing(client, task_queue, workspace, model)
        await checkpoints_taken(client, workflow_id, 2)
        await asyncio.sleep(1.0)  # the command runs
        through_proxy = await connect(f"127.0.0.1:{proxy.port}", "default")
        asked = asyncio.create_task(branching.rewind(through_proxy, workflow_id, 1))
        await asyncio.sleep(1.0)  # accepted; it waits for the command
        await proxy.stop()
        await asyncio.sleep(3.0)
        await proxy.start()
        done = await asyncio.wait_for(asked, 60)
        result = await client.get_workflow_handle_for(AgentTaskWorkflow.run,
                                                      workflow_id).result()
    await proxy.stop()
    assert done.step == 1 and done.edits_taken_back == 1
    assert result.status == "completed"
    assert [e["step"] for e in events_of(result, "rewound")] == [1]
    assert sorted(p.name for p in workspace.iterdir()) == ["a.txt", "c.txt"]


async def test_every_quality_review_of_a_rewound_task_keeps_its_own_row(
        client, settings, scripted_llm, workspace, task_queue):
    """Reviews are keyed by the task and their count: the count goes on after a rewind, so
    a review of the rewound run never takes a row of one taken back (it was dropped)."""
    review = {"json": {"pass": True, "reasons": [], "suggestions": "", "summary": "ok"}}
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [write("a.md", "# A\n"), write("b.md", "# B\n"),
                write("c.md", "# C\n", delay_ms=60_000),  # in flight when rewound
                write("d.md", "# D\n"), call("complete_step", step=1, summary="ok"),
                final("ok")],
        "quality_review": [review] * 3, "summary": [SUMMARY],
    })
    async with build_worker(client, settings, task_queue):
        workflow_id = await start_writing(client, task_queue, workspace, model,
                                          enable_quality_review=True)
        await checkpoints_taken(client, workflow_id, 2)
        # b.md's review runs after its checkpoint: a rewind asked then comes before the
        # next model turn, which would get c.md's answer. Asked once that turn is out.
        await wait_until(lambda: model_turn_running(client, workflow_id),
                         "c.md's model turn is in flight")
        await branching.rewind(client, workflow_id, 1)
        result = await client.get_workflow_handle_for(AgentTaskWorkflow.run,
                                                      workflow_id).result()
    assert result.status == "completed"
    rows = store_for(settings.effective_database_url).list_quality_reviews(
        task_id=result.task_id)
    assert [r.file_path for r in rows] == ["a.md", "b.md", "d.md"]
    assert result.stats.reviews.total == 3
