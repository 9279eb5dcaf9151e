"""What the Temporal Web UI and `temporal workflow list --query` show of an agent task:
refloop's search attributes, upserted as the task moves, and the current details (the plan
with the step in progress). The agent workflow holds one `TaskVisibility` and calls it
through `AgentBase._show`."""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributeKey

with workflow.unsafe.imports_passed_through():
    from refloop.contract import visibility
    from refloop.workflows.state import AgentState

from refloop.workflows import logic


class TaskVisibility:
    """The search attributes a run has upserted, so that only changes are written."""

    def __init__(self) -> None:
        self._shown: dict[str, Any] = {}

    def show(self, state: AgentState, status: str) -> None:
        """Upsert the search attributes that changed and refresh the current details;
        `status` is what a person sees now."""
        planning = state.planning
        step = logic.current_step(planning.plan, planning.completed_steps)
        details = visibility.plan_details(planning.plan, planning.completed_steps, step)
        workflow.set_current_details(details or f"iteration {state.stats.iterations}")
        wanted: dict[str, Any] = {
            "status": status,
            "kind": "supplement" if state.input.is_supplement else "agent_task",
            "tokens": state.stats.usage.total_tokens,
        }
        if state.input.session_id:
            wanted["session"] = state.input.session_id
        if planning.intent is not None:
            wanted["intent"] = visibility.intent_label(planning.intent)
        shown = self._shown
        changed = {key: value for key, value in wanted.items() if shown.get(key) != value}
        # Each upsert is a visibility write on the server: the token count rides along
        # with the other changes (status, intent, ...), never on its own.
        if set(changed) <= {"tokens"}:
            return
        keys: dict[str, SearchAttributeKey[Any]] = {
            "status": visibility.STATUS, "kind": visibility.KIND,
            "tokens": visibility.TOTAL_TOKENS, "session": visibility.SESSION_ID,
            "intent": visibility.INTENT}
        workflow.upsert_search_attributes(
            [keys[name].value_set(value) for name, value in changed.items()])
        self._shown = {**shown, **changed}


def show_code_review(status: str, session_id: str | None = None) -> None:
    """The code-review workflow's search attributes: kind, status (and session)."""
    updates = [visibility.STATUS.value_set(status), visibility.KIND.value_set("code_review")]
    if session_id:
        updates.append(visibility.SESSION_ID.value_set(session_id))
    workflow.upsert_search_attributes(updates)
