"""Rewinding a task to one of its checkpoints, read from its run's history: which
checkpoints the run took (in order, each after which call), and the point a Temporal reset
goes back to so that the run goes on right after that checkpoint.

Plain functions over the history's events: the CLI and the API share them, and they are
tested on recorded histories.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from temporalio.api.history.v1 import HistoryEvent

from refloop.contract import activity_calls


class CannotRewind(ValueError):
    """The rewind asked for does not exist in this run (said in the message)."""


@dataclass(frozen=True)
class RunCheckpoint:
    step: int  # 1-based, in the order the run took them
    call_id: str
    checkpoint_id: str
    completed_event_id: int


def _payload_json(payloads) -> dict:
    if not payloads.payloads:
        return {}
    try:
        value = json.loads(payloads.payloads[0].data)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def run_checkpoints(events: list[HistoryEvent]) -> list[RunCheckpoint]:
    """The checkpoints this run took, oldest first."""
    calls: dict[int, str] = {}  # scheduled event id -> the call it followed
    found: list[RunCheckpoint] = []
    for event in events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            scheduled = event.activity_task_scheduled_event_attributes
            if scheduled.activity_type.name == activity_calls.CHECKPOINT_WORKSPACE.name:
                calls[event.event_id] = str(_payload_json(scheduled.input).get("call_id", ""))
        elif event.HasField("activity_task_completed_event_attributes"):
            done = event.activity_task_completed_event_attributes
            if done.scheduled_event_id in calls:
                result = _payload_json(done.result)
                found.append(RunCheckpoint(
                    step=len(found) + 1, call_id=calls[done.scheduled_event_id],
                    checkpoint_id=str(result.get("checkpoint_id", "")),
                    completed_event_id=event.event_id))
    return found


def reset_point(events: list[HistoryEvent], checkpoint: RunCheckpoint) -> int:
    """The workflow task that took in the checkpoint's completion: a reset to it runs that
    task again, so the run goes on from just after the checkpoint."""
    for event in events:
        if event.event_id > checkpoint.completed_event_id and event.HasField(
                "workflow_task_completed_event_attributes"):
            return event.event_id
    raise CannotRewind(f"step {checkpoint.step}'s checkpoint has not been taken in by the "
                       "run yet; try again in a moment")


def choose(checkpoints: list[RunCheckpoint], step: int) -> RunCheckpoint:
    if not checkpoints:
        raise CannotRewind("this run took no workspace checkpoint (a task started before "
                           "checkpoints, started with them off, or continued into a new "
                           "run since its last change)")
    if not 1 <= step <= len(checkpoints):
        raise CannotRewind(f"no step {step}: this run took checkpoints 1 to "
                           f"{len(checkpoints)}")
    return checkpoints[step - 1]
