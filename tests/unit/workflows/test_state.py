"""AgentState across continue-as-new: state carried over by earlier code still loads."""

from __future__ import annotations

import pytest

from refloop.contract.task import Event, TaskInput
from refloop.workflows.state import AgentState


def tool_events() -> list[dict]:
    return [Event(seq=n, type=kind, ts="t", data=data).model_dump(mode="json")
            for n, (kind, data) in enumerate([
                ("tool_call", {"id": "c1", "tool": "write_file", "args": {"path": "o.md"}}),
                ("tool_result", {"id": "c1", "tool": "write_file", "ok": True,
                                 "output": "wrote", "data": {"file_path": "o.md"}}),
            ], start=1)]


def flat_state() -> dict:
    """The flat shape runs of earlier code handed to continue-as-new."""
    review = {"file_path": "o.md", "passed": True, "outcome": "passed", "tool": "write_file"}
    return {
        "input": TaskInput(task="t", workspace="w").model_dump(mode="json"),
        "task_id": "t", "status": "running",
        "intent": {"intent": "CODING_TASK", "confidence": 0.9, "reason": "r"},
        "plan": {"steps": [{"goal": "write", "tool": "write_file"}]},
        "completed_steps": [1], "step_started": 3,
        "conversation_ref": "blob-1",
        "pending": [{"role": "user", "content": "next"}],
        "events": tool_events(), "last_seq": 2,
        "stats": {"iterations": 2, "tool_calls": 1},
        "answer": "so far", "summary": None,
        "quality_reviews": [review], "review_failures": {"o.md": 1}, "review_capped": [],
        "supplements": [{"status": "completed"}],
        "constraints": {"task_type": "creation", "allowed": ["write_file"], "forbidden": []},
        "tool_violations": [{"tool": "run_cmd"}], "exceptions_used": ["run_cmd"],
        "loop_records": [], "trigger_state": {},
        "workspace_context": "a repo",
        "pending_approvals": {"1.0": None},
        "mcp_tools": {}, "mcp_tools_ref": "specs-1",
        "edits_ok": 4, "direct_answer": False,
    }


def test_the_flat_shape_of_earlier_runs_loads_into_the_groups():
    state = AgentState.model_validate(flat_state())
    assert state.planning.plan is not None and state.planning.plan.steps[0].tool == "write_file"
    assert state.planning.intent is not None and state.planning.completed_steps == [1]
    assert state.planning.step_started == 3 and state.planning.constraints is not None
    assert state.conversation.ref == "blob-1" and state.conversation.answer == "so far"
    assert [t.content for t in state.conversation.unsent_turns] == ["next"]
    assert state.calls.justified_tools == ["run_cmd"] and state.calls.violations
    assert state.all_edits_ok == 4 and [r.file_path for r in state.all_reviews] == ["o.md"]
    assert state.reviews.failures == {"o.md": 1}
    assert state.reflection.supplements == [{"status": "completed"}]
    assert state.approvals.waiting == {"1.0": None}
    assert state.mcp.specs_ref == "specs-1" and state.workspace.context == "a repo"
    assert state.stats.iterations == 2 and state.last_seq == 2
    # Its tool calls were only in its events: the ledger is rebuilt from them.
    assert [(r.tool, r.file_path) for r in state.calls.ledger] == [("write_file", "o.md")]


def test_the_grouped_shape_round_trips():
    state = AgentState.model_validate(flat_state())
    again = AgentState.model_validate(state.model_dump(mode="json"))
    assert again == state


def test_state_carried_before_the_review_count_counts_its_reviews():
    """Earlier code kept every review in `done`: its count is theirs, so the next review's
    key in the quality_reviews table follows on."""
    grouped = AgentState.model_validate(flat_state()).model_dump(mode="json")
    del grouped["reviews"]["count"]
    grouped["reviews"]["done"] *= 3
    assert AgentState.model_validate(grouped).reviews.count == 3
    assert AgentState(input=TaskInput(task="t", workspace="w"), task_id="t").reviews.count == 0


def test_a_decision_read_by_its_call_leaves_the_state():
    from refloop.contract.activity_io import ApprovalDecision
    from refloop.workflows.approval_phase import take_decision, validate_decision

    pending: dict[str, ApprovalDecision | None] = {}
    for n in range(100):  # a long task approving call after call
        key = f"{n}.0"
        pending[key] = None
        validate_decision(pending, ApprovalDecision(call_id=key, approved=True))
        pending[key] = ApprovalDecision(call_id=key, approved=True)
        assert take_decision(pending, key, forget=True).approved
    assert pending == {}
    # The same decision sent again (a retried request, or a hostile one) is refused.
    with pytest.raises(ValueError, match="no pending approval"):
        validate_decision(pending, ApprovalDecision(call_id="99.0", approved=False))
    # Runs recorded before the bound keep every decision.
    pending["1.0"] = ApprovalDecision(call_id="1.0", approved=False)
    assert not take_decision(pending, "1.0", forget=False).approved and "1.0" in pending
