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

    source = json.loads((HISTORIES[0].parent / "agent_task_completed.json").read_text())
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
