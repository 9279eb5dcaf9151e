"""Every patch of a new run is recorded in its first workflow task, before any activity: a
patch first asked for after a local activity could otherwise land in another workflow task
than replay expects, and the run would fail as non-deterministic on its next replay."""

from __future__ import annotations

import json
import os
from pathlib import Path

from temporalio.api.enums.v1 import EventType

from refloop.contract.task import TaskInput
from refloop.worker.replay import dump_history, replay_files
from refloop.workflows.patches import AGENT_PATCHES, PATCHES_AT_START
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import CODING, SUMMARY, call, final, plan_of, run_with_history

HISTORIES = Path(__file__).parent.parent / "histories"


def first_task_commands(history) -> list[tuple[str, str]]:
    """(kind, name) of what the first workflow task recorded: patch ids, activity types,
    local-activity markers."""
    events = list(history.events)
    completed = [i for i, e in enumerate(events)
                 if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED]
    commands = []
    for event in events[completed[0] + 1:]:
        if event.event_type in (EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
                                EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED):
            break
        commands.append(command_of(event))
    return [c for c in commands if c]


def command_of(event) -> tuple[str, str] | None:
    if event.HasField("marker_recorded_event_attributes"):
        marker = event.marker_recorded_event_attributes
        if marker.marker_name == "core_patch":
            return ("patch", json.loads(marker.details["patch-data"].payloads[0].data)["id"])
        return ("marker", marker.marker_name)
    if event.HasField("activity_task_scheduled_event_attributes"):
        return ("activity", event.activity_task_scheduled_event_attributes.activity_type.name)
    return None


def patch_markers(history) -> list[str]:
    return [c[1] for c in map(command_of, history.events) if c and c[0] == "patch"]


async def test_a_new_run_settles_every_patch_first(client, settings, scripted_llm, workspace,
                                                   task_queue, tmp_path):
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [call("write_file", path="a.txt", content="a"),
                call("complete_step", step=1, summary="ok"), final("ok")],
        "summary": [SUMMARY],
    })
    result, history = await run_with_history(client, settings, task_queue, TaskInput(
        task="write a", workspace=str(workspace), model=model, enable_reflection=False))
    assert result.status == "completed"
    first = first_task_commands(history)
    wanted = [("patch", PATCHES_AT_START), *(("patch", p) for p in AGENT_PATCHES)]
    assert first[:len(wanted)] == wanted, first
    # No patch is asked for anywhere else, local activities and quality reviews included.
    assert patch_markers(history) == [PATCHES_AT_START, *AGENT_PATCHES]
    saved = tmp_path / "run.json"
    saved.write_text(dump_history(history))
    assert await replay_files([saved]) == {}
    if os.environ.get("REFLOOP_RECORD_HISTORIES"):
        (HISTORIES / "agent_task_patches_at_start.json").write_text(dump_history(history))


def test_histories_before_the_change_ask_where_they_did():
    """Golden histories recorded before it have no such marker: they keep their order (the
    replay test replays them); the one recorded after settles every patch first."""
    before = json.loads((HISTORIES / "agent_task_with_search_attributes.json").read_text())
    after = json.loads((HISTORIES / "agent_task_patches_at_start.json").read_text())

    def ids(source: dict) -> list[str]:
        return [json.loads(__import__("base64").b64decode(
                    e["markerRecordedEventAttributes"]["details"]["patch-data"]["payloads"][0]
                    ["data"]))["id"]
                for e in source["events"]
                if e.get("markerRecordedEventAttributes", {}).get("markerName") == "core_patch"]

    assert PATCHES_AT_START not in ids(before)
    # Recorded with the patches known then: patches appended since are off in its replay.
    recorded = ids(after)
    assert recorded == [PATCHES_AT_START, *AGENT_PATCHES[:len(recorded) - 1]]
