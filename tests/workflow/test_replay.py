"""Golden histories under tests/histories/ must replay against the current code."""

from __future__ import annotations

from pathlib import Path

import pytest

from refloop.worker.replay import replay_files

HISTORIES = sorted((Path(__file__).parent.parent / "histories").glob("*.json"))


def test_golden_histories_exist():
    assert HISTORIES, "no golden histories: run `make histories`"


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_history_replays_deterministically(path: Path):
    assert await replay_files([path]) == {}


async def test_replay_catches_a_changed_workflow(tmp_path: Path):
    """The check can fail: a history whose commands no longer match the code is flagged."""
    source = HISTORIES[0].read_text()
    assert "refloop.llm.make_plan" in source
    tampered = tmp_path / "tampered.json"
    tampered.write_text(source.replace("refloop.llm.make_plan", "refloop.llm.renamed_plan"))
    failures = await replay_files([tampered])
    assert str(tampered) in failures


async def test_a_tools_retry_policy_is_not_replayed(tmp_path: Path):
    """A tool's activity options come from its properties; changing them (run_cmd went from
    3 attempts to 1) leaves the commands alone, so histories recorded before replay."""
    import json

    source = json.loads((HISTORIES[0].parent / "agent_task_with_checkpoints.json").read_text())
    changed = 0
    for event in source["events"]:
        scheduled = event.get("activityTaskScheduledEventAttributes")
        if scheduled and scheduled["activityType"]["name"].startswith("refloop.tool."):
            scheduled["retryPolicy"]["maximumAttempts"] = 7
            scheduled["heartbeatTimeout"] = "61s"
            changed += 1
    assert changed
    edited = tmp_path / "other_policy.json"
    edited.write_text(json.dumps(source))
    assert await replay_files([edited]) == {}


async def test_a_running_tasks_tools_do_not_change_with_the_code(
        client, settings, scripted_llm, workspace, task_queue, tmp_path: Path, monkeypatch):
    """A task's tools are fixed at its start: a tool removed from the code (or given other
    properties) after it started changes nothing in its replay."""
    import dataclasses

    from refloop.contract import tool_catalog
    from refloop.contract.task import TaskInput
    from refloop.contract.tool_properties import ToolProperties
    from refloop.worker.replay import dump_history
    from tests.llm_fixtures import unique_scenario
    from tests.workflow.helpers import CODING, SUMMARY, call, final, plan_of, run_with_history

    (workspace / "a.txt").write_text("a\n")
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("read_file", "write_file")],
        "act": [call("read_file", path="a.txt"), call("write_file", path="b.txt", content="b"),
                final("read and wrote")],
        "summary": [SUMMARY],
    })
    inp = TaskInput(task="copy a", workspace=str(workspace), model=model,
                    enable_reflection=False, approval_mode="auto")
    result, history = await run_with_history(client, settings, task_queue, inp)
    assert result.status == "completed" and (workspace / "b.txt").read_text() == "b"
    recorded = tmp_path / "before.json"
    recorded.write_text(dump_history(history))
    # The code changes: read_file is gone, write_file now waits for approval in auto mode.
    monkeypatch.delitem(tool_catalog.TOOLS, "read_file")
    write = tool_catalog.TOOLS["write_file"]
    monkeypatch.setitem(tool_catalog.TOOLS, "write_file", dataclasses.replace(
        write, properties=ToolProperties(kind="write", journaled=True,
                                         approval=frozenset({"auto"}))))
    assert await replay_files([recorded]) == {}
