"""What a fork carries from the task it branches off, read from the original run's history:
the checkpoint of step N, the plan and the plan steps marked done up to it, and the
conversation up to and including step N's call (its result, as the model read it).

Plain functions over history events and messages: the CLI and the API share them, and they
are tested on built histories.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from temporalio.api.history.v1 import HistoryEvent

from refloop.checkpoints.rewind import (
    RunCheckpoint,
    _payload_json,
    choose,
    effective_events,
    run_checkpoints,
)
from refloop.contract import activity_calls
from refloop.contract.messages import ChatMessage, Plan

COMPLETE_STEP = "complete_step"  # the plan's own step marker (handled inside the workflow)
# A step whose results the original run never sent back to the model (it ended first)
RESULT_NOT_KEPT = ("(the result of this call was not kept: the original run ended before "
                   "it went back to the model; the workspace is as the call left it)")


@dataclass
class _Act:
    scheduled_id: int
    messages: list[dict] = field(default_factory=list)  # the turns sent with this call
    completed_id: int | None = None
    result: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Carried:
    """A fork's share of the original run up to its step."""

    checkpoint: RunCheckpoint
    plan: Plan | None
    completed_steps: list[int]
    conversation_ref: str | None  # the stored conversation before the step's model turn
    turns: list[ChatMessage]  # after it: the step's call and the results sent back


def _acts_and_plans(events: list[HistoryEvent]) -> tuple[list[_Act], list[tuple[int, dict]]]:
    """Model turns (in order) and accepted-or-not plans (completed event id, plan JSON)."""
    names: dict[int, str] = {}
    acts: dict[int, _Act] = {}
    plans: list[tuple[int, dict]] = []
    for event in events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            scheduled = event.activity_task_scheduled_event_attributes
            names[event.event_id] = scheduled.activity_type.name
            if scheduled.activity_type.name == activity_calls.ACT.name:
                acts[event.event_id] = _Act(
                    event.event_id, list(_payload_json(scheduled.input).get("messages") or []))
        elif event.HasField("activity_task_completed_event_attributes"):
            done = event.activity_task_completed_event_attributes
            name = names.get(done.scheduled_event_id)
            if name == activity_calls.ACT.name:
                act = acts[done.scheduled_event_id]
                act.completed_id, act.result = event.event_id, _payload_json(done.result)
            elif name == activity_calls.MAKE_PLAN.name:
                plan = _payload_json(done.result).get("plan")
                if isinstance(plan, dict):
                    plans.append((event.event_id, plan))
    return sorted(acts.values(), key=lambda a: a.scheduled_id), plans


def call_position(call_id: str) -> tuple[int, int]:
    """(iteration, index) of a call id `<workflow>.<run>.<iteration>.<index>`."""
    parts = call_id.rsplit(".", 2)
    try:
        return int(parts[-2]), int(parts[-1])
    except (IndexError, ValueError):
        raise ValueError(f"not a call id: {call_id!r}") from None


def marked_steps(plan: Plan | None, calls: list[dict]) -> list[int]:
    """The plan steps `complete_step` calls marked done (the workflow's own rule: a whole
    number within the plan)."""
    if plan is None:
        return []
    done: set[int] = set()
    for call in calls:
        step = (call.get("arguments") or {}).get("step")
        if call.get("name") == COMPLETE_STEP and isinstance(step, int) \
                and not isinstance(step, bool) and 1 <= step <= len(plan.steps):
            done.add(step)
    return sorted(done)


def turns_up_to(sent: list[dict] | None, calls: list[dict], content: str | None,
                index: int) -> list[ChatMessage]:
    """The turns after a model answer up to and including its call `index`: the assistant
    turn with the calls up to it, and their results as the next model turn read them
    (`sent`; None when the run ended first). With the answer's last call, everything sent
    comes along (the reflection on the turn included); before it, the later calls and what
    was said about them stay behind."""
    if sent is not None and index + 1 >= max(len(calls), 1):
        return [ChatMessage.model_validate(m) for m in sent]
    kept = calls[:index + 1]
    if sent is None:  # the run ended before the results went back
        if not calls:  # a call written as text: one per answer
            return [ChatMessage(role="assistant", content=content),
                    ChatMessage(role="user", content=RESULT_NOT_KEPT)]
        return [ChatMessage(role="assistant", content=content, tool_calls=kept),
                *(ChatMessage(role="tool", tool_call_id=c.get("id"), name=c.get("name"),
                              content=RESULT_NOT_KEPT) for c in kept)]
    ids = {c.get("id") for c in kept}
    messages = [ChatMessage.model_validate(m) for m in sent]
    out: list[ChatMessage] = []
    for message in messages:
        if message.role == "assistant" and message.tool_calls:
            out.append(message.model_copy(update={
                "tool_calls": [c for c in message.tool_calls if c.id in ids]}))
        elif message.role == "tool":
            if message.tool_call_id in ids:
                out.append(message)
        elif out:  # a user turn after the results: about the whole turn
            break
        else:
            out.append(message)
    return out


def carried_to(events: list[HistoryEvent], step: int) -> Carried:
    """What a fork at `step` (1-based, the run's checkpoints in order) carries."""
    events = effective_events(events)  # what rewinds took back is not carried
    chosen = choose(run_checkpoints(events), step)
    _, index = call_position(chosen.call_id)
    acts, plans = _acts_and_plans(events)
    before = [a for a in acts if a.completed_id is not None
              and a.completed_id < chosen.completed_event_id]
    plan_json = next((p for done, p in reversed(plans) if done < chosen.completed_event_id),
                     None)
    plan = Plan.model_validate(plan_json) if plan_json is not None else None
    if not before:  # a checkpoint with no model turn before it cannot be a tool call's
        return Carried(chosen, plan, [], None, [])
    turn = before[-1]
    calls = list(turn.result.get("tool_calls") or [])
    answered = [c for a in before[:-1] for c in a.result.get("tool_calls") or []]
    following = next((a for a in acts if a.scheduled_id > chosen.completed_event_id), None)
    turns = turns_up_to(following.messages if following else None, calls,
                        turn.result.get("content"), index)
    return Carried(chosen, plan, marked_steps(plan, [*answered, *calls[:index + 1]]),
                   turn.result.get("conversation_ref"), turns)


def forked_conversation(stored: list[ChatMessage], turns: list[ChatMessage],
                        old_workspace: str, new_workspace: str,
                        instruction: str | None) -> list[ChatMessage]:
    """The fork's conversation: the original's up to the step, its system prompt naming the
    new workspace, and the new instruction (if any) as the last user turn."""
    messages = [*stored, *turns]
    if messages and messages[0].role == "system" and messages[0].content \
            and old_workspace and old_workspace != new_workspace:
        messages[0] = messages[0].model_copy(update={
            "content": messages[0].content.replace(old_workspace, new_workspace)})
    if instruction:
        messages.append(ChatMessage(role="user", content=(
            "This task was forked from the step above; from here, follow this new "
            f"instruction:\n{instruction}")))
    return messages
