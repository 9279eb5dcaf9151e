"""What a fork carries from the original run up to its step, the checkpoints as a run's
rewinds left them, and what a rewind counts as rewound: decided by plain functions."""

from __future__ import annotations

import json

import pytest
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.api.history.v1 import (
    ActivityTaskCompletedEventAttributes,
    ActivityTaskScheduledEventAttributes,
    HistoryEvent,
    WorkflowExecutionUpdateAcceptedEventAttributes,
    WorkflowExecutionUpdateCompletedEventAttributes,
    WorkflowTaskCompletedEventAttributes,
)

from refloop.checkpoints.fork import (
    RESULT_NOT_KEPT,
    call_position,
    carried_to,
    forked_conversation,
)
from refloop.checkpoints.rewind import CannotRewind, run_checkpoints
from refloop.contract import activity_calls
from refloop.contract.checkpoints import REWIND_UPDATE
from refloop.contract.messages import ChatMessage, TokenUsage
from refloop.contract.task import TaskStats
from refloop.workflows.accounting import mark_rewound, usage_since

PLAN = {"task_type": "coding", "steps": [{"goal": "write a", "tool": "write_file"},
                                          {"goal": "write b and c", "tool": "write_file"}]}


def payloads(value: dict) -> Payloads:
    return Payloads(payloads=[Payload(metadata={"encoding": b"json/plain"},
                                      data=json.dumps(value).encode())])


class History:
    def __init__(self) -> None:
        self.events: list[HistoryEvent] = []

    def _next(self) -> int:
        return len(self.events) + 1

    def activity(self, call, inp: dict, result: dict) -> None:
        scheduled = self._next()
        self.events.append(HistoryEvent(
            event_id=scheduled, activity_task_scheduled_event_attributes=(
                ActivityTaskScheduledEventAttributes(input=payloads(inp)))))
        self.events[-1].activity_task_scheduled_event_attributes.activity_type.name = call.name
        self.events.append(HistoryEvent(
            event_id=self._next(), activity_task_completed_event_attributes=(
                ActivityTaskCompletedEventAttributes(scheduled_event_id=scheduled,
                                                     result=payloads(result)))))

    def update(self, name: str, arg: dict, result: dict | None) -> None:
        """An update accepted, then answered (`result`) or failed (None)."""
        accepted = self._next()
        self.events.append(HistoryEvent(
            event_id=accepted, workflow_execution_update_accepted_event_attributes=(
                WorkflowExecutionUpdateAcceptedEventAttributes())))
        request = self.events[-1].workflow_execution_update_accepted_event_attributes
        request.accepted_request.input.name = name
        request.accepted_request.input.args.CopyFrom(payloads(arg))
        completed = WorkflowExecutionUpdateCompletedEventAttributes(accepted_event_id=accepted)
        if result is None:
            completed.outcome.failure.message = "refused"
        else:
            completed.outcome.success.CopyFrom(payloads(result))
        self.events.append(HistoryEvent(
            event_id=self._next(),
            workflow_execution_update_completed_event_attributes=completed))

    def workflow_task(self) -> None:
        self.events.append(HistoryEvent(
            event_id=self._next(),
            workflow_task_completed_event_attributes=WorkflowTaskCompletedEventAttributes()))


def tool_call(call_id: str, name: str, **arguments) -> dict:
    return {"id": call_id, "name": name, "arguments": arguments}


def usage(tokens: int, model: str = "m1") -> dict:
    return {"purpose": "act", "model": model,
            "usage": {"total_tokens": tokens, "prompt_tokens": tokens, "calls": 1}}


C1 = tool_call("c1", "write_file", path="a.txt", content="a")
C2 = tool_call("c2", "complete_step", step=1, summary="a written")
C3 = tool_call("c3", "write_file", path="b.txt", content="b")
C4 = tool_call("c4", "write_file", path="c.txt", content="c")
SECOND_TURN = [
    {"role": "assistant", "content": None, "tool_calls": [C1, C2]},
    {"role": "tool", "tool_call_id": "c1", "name": "write_file", "content": "wrote a"},
    {"role": "tool", "tool_call_id": "c2", "name": "complete_step", "content": "step 1"},
    {"role": "user", "content": "reflection: keep going"},
]
THIRD_TURN = [
    {"role": "assistant", "content": "two files", "tool_calls": [C3, C4]},
    {"role": "tool", "tool_call_id": "c3", "name": "write_file", "content": "wrote b"},
    {"role": "tool", "tool_call_id": "c4", "name": "write_file", "content": "wrote c"},
]


def checkpoint(history: History, call_id: str, letter: str) -> None:
    history.activity(activity_calls.CHECKPOINT_WORKSPACE, {"call_id": call_id},
                     {"checkpoint_id": letter * 64})


def a_run(ended_early: bool = False) -> list[HistoryEvent]:
    """Plan; turn 1: write a.txt and mark step 1 (checkpoint 1); turn 2: write b.txt and
    c.txt (checkpoints 2 and 3); turn 3: the final answer (unless the run ended first)."""
    h = History()
    h.activity(activity_calls.MAKE_PLAN, {}, {"plan": PLAN, "usage": usage(5)})
    h.activity(activity_calls.ACT, {"messages": [{"role": "system", "content": "s"}]},
               {"tool_calls": [C1, C2], "conversation_ref": "R1", "usage": usage(10)})
    checkpoint(h, "wf.run1.1.0", "a")
    h.workflow_task()
    h.activity(activity_calls.ACT, {"messages": SECOND_TURN, "conversation_ref": "R1"},
               {"content": "two files", "tool_calls": [C3, C4], "conversation_ref": "R2",
                "usage": usage(20)})
    checkpoint(h, "wf.run1.2.0", "b")
    h.workflow_task()
    checkpoint(h, "wf.run1.2.1", "c")
    h.workflow_task()
    if not ended_early:
        h.activity(activity_calls.ACT, {"messages": THIRD_TURN, "conversation_ref": "R2"},
                   {"content": "done", "conversation_ref": "R3", "usage": usage(40, "m2")})
        h.workflow_task()
    return h.events


def roles(messages: list[ChatMessage]) -> list[str]:
    return [m.role for m in messages]


def test_a_fork_at_a_turns_first_call_leaves_its_later_calls_and_reflection_behind():
    carried = carried_to(a_run(), 1)
    assert carried.checkpoint.checkpoint_id == "a" * 64
    assert carried.plan is not None and len(carried.plan.steps) == 2
    assert carried.conversation_ref == "R1"
    assert roles(carried.turns) == ["assistant", "tool"]
    assert [c.id for c in carried.turns[0].tool_calls] == ["c1"]
    assert carried.turns[1].content == "wrote a"
    assert carried.completed_steps == []  # step 1 was marked by the call left behind


def test_a_fork_carries_the_steps_marked_before_it_and_the_conversation_up_to_its_call():
    carried = carried_to(a_run(), 2)
    assert carried.conversation_ref == "R2"
    assert carried.completed_steps == [1]
    assert [c.id for c in carried.turns[0].tool_calls] == ["c3"]
    assert [m.tool_call_id for m in carried.turns[1:]] == ["c3"]


def test_a_fork_at_a_turns_last_call_carries_everything_sent_back():
    carried = carried_to(a_run(), 3)
    assert [m.model_dump(exclude_none=True) for m in carried.turns] == [
        {k: v for k, v in m.items() if v is not None} for m in THIRD_TURN]


def test_a_fork_of_a_run_that_ended_before_its_results_went_back_says_so():
    carried = carried_to(a_run(ended_early=True), 3)
    assert roles(carried.turns) == ["assistant", "tool", "tool"]
    assert {m.content for m in carried.turns[1:]} == {RESULT_NOT_KEPT}


@pytest.mark.parametrize("step", [0, 4, 99])
def test_a_step_the_run_never_took_is_refused(step: int):
    with pytest.raises(CannotRewind, match="no step"):
        carried_to(a_run(), step)


def test_a_run_without_checkpoints_is_refused():
    with pytest.raises(CannotRewind, match="no workspace checkpoint"):
        carried_to(History().events, 1)


def test_the_fork_conversation_names_its_own_workspace_and_ends_on_the_instruction():
    stored = [ChatMessage(role="system", content="You work in /ws/orig. Paths in /ws/orig."),
              ChatMessage(role="user", content="write files in /ws/orig")]
    out = forked_conversation(stored, [ChatMessage(role="assistant", content="ok")],
                              "/ws/orig", "/ws/fork", "use the other library")
    assert out[0].content == "You work in /ws/fork. Paths in /ws/fork."
    assert out[1].content == "write files in /ws/orig"  # only the system prompt is redone
    assert roles(out) == ["system", "user", "assistant", "user"]
    assert out[-1].content.endswith("use the other library")
    assert forked_conversation(stored, [], "/ws/orig", "/ws/fork", None)[-1] == stored[-1]


def test_call_positions_are_read_from_the_call_id():
    assert call_position("task-1.abcd1234.7.2") == (7, 2)
    with pytest.raises(ValueError):
        call_position("nonsense")


def rewound_run() -> list[HistoryEvent]:
    """`a_run` rewound to step 1 once it took checkpoint 3, then a new turn: write d.txt
    (checkpoint 2 of the run as the rewind left it); a failed rewind changes nothing."""
    h = History()
    h.events = a_run()
    h.update(REWIND_UPDATE, {"step": 1}, {"step": 1, "checkpoint_id": "a" * 64})
    h.update(REWIND_UPDATE, {"step": 1}, None)
    h.workflow_task()
    h.activity(activity_calls.ACT, {"messages": SECOND_TURN, "conversation_ref": "R1"},
               {"tool_calls": [tool_call("c5", "write_file", path="d.txt", content="d")],
                "conversation_ref": "R4", "usage": usage(30)})
    checkpoint(h, "wf.run1x.2.0", "d")
    h.workflow_task()
    return h.events


def test_a_rewind_takes_its_later_checkpoints_out_of_the_runs_numbering():
    points = run_checkpoints(rewound_run())
    assert [(p.step, p.checkpoint_id[0]) for p in points] == [(1, "a"), (2, "d")]
    assert [p.step for p in run_checkpoints(a_run())] == [1, 2, 3]  # no rewind: all


def test_a_fork_after_a_rewind_carries_the_run_as_the_rewind_left_it():
    carried = carried_to(rewound_run(), 2)
    assert carried.checkpoint.checkpoint_id == "d" * 64
    assert carried.conversation_ref == "R4"
    assert [c.id for c in carried.turns[0].tool_calls] == ["c5"]
    assert carried.completed_steps == [1]  # marked before the point; nothing taken back


def test_usage_since_a_point_is_the_difference_of_the_running_totals():
    then = TokenUsage(total_tokens=100, calls=3)
    now = TokenUsage(total_tokens=140, calls=4, failed_calls=1)
    since = usage_since(now, then)
    assert (since.total_tokens, since.calls, since.failed_calls) == (40, 1, 1)


def test_rewound_cost_stays_in_the_totals_and_is_counted_apart_by_model():
    then = TokenUsage(total_tokens=100, calls=3)
    stats = TaskStats(usage=TokenUsage(total_tokens=160, calls=5),
                      usage_by_model={"m1": TokenUsage(total_tokens=120, calls=4),
                                      "m2": TokenUsage(total_tokens=40, calls=1)})
    after = mark_rewound(stats, then, {"m1": then})
    assert after.usage == stats.usage  # paid for: the totals keep it
    assert after.rewound_usage.total_tokens == 60 and after.rewound_usage.calls == 2
    assert after.rewound_by_model["m1"].calls == 1 and after.rewound_by_model["m2"].calls == 1
    again = mark_rewound(after, after.usage, after.usage_by_model)  # nothing spent since
    assert again.rewound_usage == after.rewound_usage


def test_a_fork_restores_only_into_a_new_or_empty_directory(tmp_path):
    """Checked on the host, whatever the API saw: a directory holding files of its own is
    refused; a retried restore, which finds only the checkpoint's own paths, is not."""
    import os

    from refloop.checkpoints.manifest import Entry, Manifest
    from refloop.checkpoints.restore import NotFresh, refuse_unless_fresh

    manifest = Manifest(entries=[Entry(path="notes/a.md", kind="file"),
                                 Entry(path="top.txt", kind="file")])
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        refuse_unless_fresh(fd, manifest)  # empty
        (tmp_path / "notes").mkdir()
        (tmp_path / "top.txt").write_text("half restored")
        refuse_unless_fresh(fd, manifest)  # a retry after a partial restore
        (tmp_path / "precious.db").write_text("someone else's")
        with pytest.raises(NotFresh, match=r"not empty \(precious.db\)"):
            refuse_unless_fresh(fd, manifest)
    finally:
        os.close(fd)
