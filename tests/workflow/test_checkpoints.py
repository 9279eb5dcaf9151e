"""Workspace checkpoints taken by a task on the real dev server: one after each call that
may change the workspace, its id in that call's event and in the task's list; any of them
restores the workspace as it was after that call, on an empty disk."""

from __future__ import annotations

from pathlib import Path

from temporalio.testing import ActivityEnvironment

from refloop.activities.checkpoint_activities import CheckpointActivities
from refloop.contract.checkpoints import RestoreInput
from refloop.store.db import store_for
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import CODING, SUMMARY, call, events_of, final, plan_of, run_task


def steps_scenario() -> dict:
    return {
        "intent": [CODING],
        "plan": [plan_of("write_file")],
        "act": [call("write_file", path="a.txt", content="one\n"),
                call("read_file", path="a.txt"),
                call("write_file", path="b/c.txt", content="two\n"),
                call("write_file", path="a.txt", content="one, edited\n"),
                call("write_file", path="../escape.txt", content="refused\n"),
                call("complete_step", step=1, summary="ok"), final("ok")],
        "summary": [SUMMARY],
    }


async def test_each_change_is_checkpointed_and_any_step_restores_on_an_empty_disk(
        client, settings, scripted_llm, workspace, task_queue, tmp_path: Path):
    model = unique_scenario(scripted_llm, steps_scenario())
    result = await run_task(client, settings, task_queue, model, workspace,
                            record_as="agent_task_with_checkpoints")
    assert result.status == "completed"

    results = events_of(result, "tool_result")
    by_tool = [(r["tool"], r["ok"], r.get("checkpoint")) for r in results]
    writes = [checkpoint for tool, ok, checkpoint in by_tool if tool == "write_file" and ok]
    assert len(writes) == 3 and all(writes) and len(set(writes)) == 3
    assert [c for tool, _, c in by_tool if tool in ("read_file", "complete_step")] == [None, None]
    refused = [r for r in results if r["tool"] == "write_file" and not r["ok"]]
    assert refused and "checkpoint" not in refused[0]  # a failed edit changed nothing

    listed = store_for(settings.effective_database_url).checkpoints_of(result.task_id)
    assert [row.checkpoint_id for row in listed] == writes

    # After the second write: a.txt as first written, and b/c.txt; on another disk.
    elsewhere = tmp_path / "another-host" / "ws"
    elsewhere.mkdir(parents=True)
    restorer = CheckpointActivities(settings, store_for(settings.effective_database_url))
    await ActivityEnvironment().run(restorer.restore, RestoreInput(
        workspace=str(elsewhere), checkpoint_id=writes[1]))
    assert sorted(str(p.relative_to(elsewhere)) for p in elsewhere.rglob("*")) == [
        "a.txt", "b", "b/c.txt"]
    assert (elsewhere / "a.txt").read_text() == "one\n"
    assert (workspace / "a.txt").read_text() == "one, edited\n"  # the task's own: untouched


async def test_a_command_is_checkpointed_even_when_it_fails(client, settings, scripted_llm,
                                                            workspace, task_queue):
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("run_cmd")],
        "act": [call("run_cmd", command="sh -c 'echo made > made.txt; exit 3'"),
                call("complete_step", step=1, summary="ok"), final("ok")],
        "summary": [SUMMARY],
    })
    result = await run_task(client, settings, task_queue, model, workspace,
                            allow_shell_operators=True)
    command = [r for r in events_of(result, "tool_result") if r["tool"] == "run_cmd"][0]
    assert (workspace / "made.txt").exists()
    assert command.get("checkpoint"), command


async def test_a_task_can_go_without_checkpoints(client, settings, scripted_llm, workspace,
                                                 task_queue):
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [call("write_file", path="a.txt", content="a"),
                call("complete_step", step=1, summary="ok"), final("ok")],
        "summary": [SUMMARY],
    })
    result = await run_task(client, settings, task_queue, model, workspace, checkpoints=False)
    assert result.status == "completed"
    assert all("checkpoint" not in r for r in events_of(result, "tool_result"))
    assert store_for(settings.effective_database_url).checkpoints_of(result.task_id) == []
