"""The agent workflow's phases share `AgentBase` and override none of it: no behaviour
depends on the order of the mixins in the class line."""

from __future__ import annotations

from refloop.workflows.agent import AgentTaskWorkflow
from refloop.workflows.agent_base import AgentBase


def test_no_phase_overrides_a_shared_helper():
    shared = {name for name in vars(AgentBase) if not name.startswith("__")}
    phases = [cls for cls in AgentTaskWorkflow.__mro__ if cls not in (AgentBase, object)]
    overridden = {f"{cls.__name__}.{name}" for cls in phases for name in vars(cls)
                  if name in shared}
    assert not overridden, overridden


def test_each_phase_method_has_one_owner():
    """A method two phases define would be chosen by mixin order: none is."""
    phases = [cls for cls in AgentTaskWorkflow.__mro__[1:] if cls not in (AgentBase, object)]
    owners: dict[str, list[str]] = {}
    for cls in phases:
        for name, value in vars(cls).items():
            if callable(value) and not name.startswith("__"):
                owners.setdefault(name, []).append(cls.__name__)
    assert {name: names for name, names in owners.items() if len(names) > 1} == {}
