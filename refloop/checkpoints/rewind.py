"""A task's checkpoints, read from its run's history: which checkpoints the run took (in
order, each after which call), as its rewinds left them; rewind and fork name them by that
order. A checkpoint is in the result of the built-in tool call that took it (its
`checkpoint`), or of a checkpoint activity of its own (MCP calls, one taken again after it
failed, runs recorded before tool calls took their own).

Plain functions over the history's events: the CLI and the API share them, and they are
tested on recorded histories.
"""

from __future__ import annotations

from dataclasses import dataclass

from temporalio.api.history.v1 import HistoryEvent
from temporalio.converter import PayloadConverter

from refloop.contract import activity_calls
from refloop.contract.checkpoints import REWIND_UPDATE


class CannotRewind(ValueError):
    """The rewind asked for does not exist in this run (said in the message)."""


@dataclass(frozen=True)
class RunCheckpoint:
    step: int  # 1-based, in the order the run took them
    call_id: str
    checkpoint_id: str
    completed_event_id: int


def _payload_json(payloads) -> dict:
    """The first payload of a `Payloads`, through the SDK's payload converter (JSON as the
    workers write it; a codec, if the client has one, is undone before: `decoded_payloads`)."""
    if not payloads.payloads:
        return {}
    try:
        value = PayloadConverter.default.from_payload(payloads.payloads[0])
    except (ValueError, RuntimeError, TypeError):
        return {}
    return value if isinstance(value, dict) else {}


def payload_fields(event: HistoryEvent) -> list:
    """The `Payloads` of an event that rewind and fork read."""
    if event.HasField("activity_task_scheduled_event_attributes"):
        return [event.activity_task_scheduled_event_attributes.input]
    if event.HasField("activity_task_completed_event_attributes"):
        return [event.activity_task_completed_event_attributes.result]
    if event.HasField("workflow_execution_started_event_attributes"):
        return [event.workflow_execution_started_event_attributes.input]
    if event.HasField("workflow_execution_update_accepted_event_attributes"):
        return [event.workflow_execution_update_accepted_event_attributes
                .accepted_request.input.args]
    if event.HasField("workflow_execution_update_completed_event_attributes"):
        return [event.workflow_execution_update_completed_event_attributes.outcome.success]
    return []


def _checkpoint_id(name: str, result: dict) -> str | None:
    """The checkpoint a completed activity took: a checkpoint activity's, or a tool call's
    that took its own (None: none, or it failed)."""
    if name == activity_calls.CHECKPOINT_WORKSPACE.name:
        return str(result.get("checkpoint_id", ""))
    taken = result.get("checkpoint")
    if isinstance(taken, dict) and taken.get("checkpoint_id"):
        return str(taken["checkpoint_id"])
    return None


def _checkpoints_in(events: list[HistoryEvent]) -> list[RunCheckpoint]:
    # scheduled event id -> (activity, the call it ran or followed)
    calls: dict[int, tuple[str, str]] = {}
    found: list[RunCheckpoint] = []
    for event in events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            scheduled = event.activity_task_scheduled_event_attributes
            name = scheduled.activity_type.name
            if name == activity_calls.CHECKPOINT_WORKSPACE.name:
                calls[event.event_id] = (name, str(_payload_json(scheduled.input)
                                                   .get("call_id", "")))
            elif name.startswith(activity_calls.TOOL_PREFIX):
                inp = _payload_json(scheduled.input)
                if inp.get("checkpoint"):  # asked to take its own
                    calls[event.event_id] = (name, str(inp.get("call_id", "")))
        elif event.HasField("activity_task_completed_event_attributes"):
            done = event.activity_task_completed_event_attributes
            if done.scheduled_event_id not in calls:
                continue
            name, call_id = calls[done.scheduled_event_id]
            checkpoint_id = _checkpoint_id(name, _payload_json(done.result))
            if checkpoint_id is not None:
                found.append(RunCheckpoint(
                    step=len(found) + 1, call_id=call_id, checkpoint_id=checkpoint_id,
                    completed_event_id=event.event_id))
    return found


def effective_events(events: list[HistoryEvent]) -> list[HistoryEvent]:
    """The run's events as its rewinds left it: a rewind to step N that succeeded takes out
    everything between checkpoint N's completion and the rewind's answer (the calls it took
    back and their checkpoints), as the run itself forgot them."""
    rewinds: set[int] = set()  # accepted event ids of rewind updates
    kept: list[HistoryEvent] = []
    for event in events:
        if event.HasField("workflow_execution_update_accepted_event_attributes"):
            accepted = event.workflow_execution_update_accepted_event_attributes
            if accepted.accepted_request.input.name == REWIND_UPDATE:
                rewinds.add(event.event_id)
        elif event.HasField("workflow_execution_update_completed_event_attributes"):
            done = event.workflow_execution_update_completed_event_attributes
            step = _payload_json(done.outcome.success).get("step")
            if done.accepted_event_id in rewinds and isinstance(step, int):
                checkpoints = _checkpoints_in(kept)
                if 1 <= step <= len(checkpoints):
                    cut = checkpoints[step - 1].completed_event_id
                    kept = [e for e in kept if e.event_id <= cut]
        kept.append(event)
    return kept


def run_checkpoints(events: list[HistoryEvent]) -> list[RunCheckpoint]:
    """The checkpoints this run took, oldest first, as its rewinds left them: the steps a
    rewind or a fork names."""
    return _checkpoints_in(effective_events(events))


def choose(checkpoints: list[RunCheckpoint], step: int) -> RunCheckpoint:
    if not checkpoints:
        raise CannotRewind("this run took no workspace checkpoint (a task started before "
                           "checkpoints, started with them off, or continued into a new "
                           "run since its last change)")
    if not 1 <= step <= len(checkpoints):
        raise CannotRewind(f"no step {step}: this run took checkpoints 1 to "
                           f"{len(checkpoints)}")
    return checkpoints[step - 1]
