"""State that crosses a run boundary (continue-as-new, a hand-over to a new build) is a typed
model whose evolution keeps old state loading: each baseline's saved state must still load
and keep its meaning. Add a file here when the state's shape changes; never edit one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from refloop.workflows.state import AgentState

SAVED = sorted((Path(__file__).parents[2] / "fixtures").glob("agent_state_*.json"))


def test_there_is_a_saved_state():
    assert SAVED


@pytest.mark.parametrize("path", SAVED, ids=[p.stem for p in SAVED])
def test_a_saved_state_loads_and_keeps_its_meaning(path: Path):
    raw = json.loads(path.read_text())
    state = AgentState.model_validate(raw)
    assert state.task_id == raw["task_id"] and state.input.task == raw["input"]["task"]
    assert state.last_seq == raw["last_seq"] and len(state.events) == len(raw["events"])
    assert state.approvals.waiting.keys() == raw["approvals"]["waiting"].keys()
    if raw["calls"].get("turn"):
        assert state.calls.turn is not None
        assert state.calls.turn.next_index == raw["calls"]["turn"]["next_index"]
    # and goes round again unchanged
    assert AgentState.model_validate(state.model_dump(mode="json")) == state


def test_a_state_without_the_fields_added_since_loads_with_their_defaults():
    raw = json.loads(SAVED[0].read_text())
    for key in ("waits",):
        raw.pop(key, None)
    raw["calls"].pop("turn", None)
    state = AgentState.model_validate(raw)
    assert state.waits == {} and state.calls.turn is None
