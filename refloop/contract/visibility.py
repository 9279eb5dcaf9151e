"""What the Temporal Web UI and `temporal` CLI show of a task: custom search attributes,
summaries and details. Plain data and pure functions (workflow code uses them)."""

from __future__ import annotations

from typing import Any

from temporalio.common import SearchAttributeKey

# Exact names: outside checks and saved Web UI filters use them.
STATUS = SearchAttributeKey.for_keyword("RefloopStatus")
KIND = SearchAttributeKey.for_keyword("RefloopKind")
SESSION_ID = SearchAttributeKey.for_keyword("RefloopSessionId")
INTENT = SearchAttributeKey.for_keyword("RefloopIntent")
TOTAL_TOKENS = SearchAttributeKey.for_int("RefloopTotalTokens")

SEARCH_ATTRIBUTES: dict[str, str] = {
    "RefloopStatus": "Keyword",
    "RefloopKind": "Keyword",
    "RefloopSessionId": "Keyword",
    "RefloopIntent": "Keyword",
    "RefloopTotalTokens": "Int",
}

SUMMARY_CHARS = 200  # the Web UI shows one line


def clip(text: str, limit: int = SUMMARY_CHARS) -> str:
    """One line of at most `limit` characters."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def task_summary(task: str) -> str:
    return clip(task)


def plan_details(plan: Any, completed: list[int], current: int | None) -> str:
    """Markdown of the plan with each step's state, for the workflow's current details."""
    steps = plan.steps if plan is not None else []
    if not steps:
        return ""
    lines = []
    if current:
        lines.append(f"**step {current}/{len(steps)}: {clip(steps[current - 1].goal, 120)}**")
        lines.append("")
    for number, step in enumerate(steps, start=1):
        mark = "x" if number in completed else " "
        arrow = " ←" if number == current else ""
        lines.append(f"- [{mark}] {number}. {clip(step.goal, 160)} `{step.tool}`{arrow}")
    return "\n".join(lines)


def model_call_summary(purpose: str, iteration: int | None = None,
                       step: int | None = None, total_steps: int = 0) -> str:
    """'act · iteration 4 · step 2/5': what a model call was for."""
    parts = [purpose]
    if iteration:
        parts.append(f"iteration {iteration}")
    if step:
        parts.append(f"step {step}/{total_steps}" if total_steps else f"step {step}")
    return " · ".join(parts)


def intent_label(intent: Any) -> str:
    """The intent's label as a plain string (an enum's value)."""
    label = getattr(intent, "intent", intent)
    return str(getattr(label, "value", label))


def start_metadata(task: str, workspace: str = "") -> dict[str, str]:
    """`start_workflow` keyword arguments: the Web UI's summary (the task, one line) and
    static details (the whole task and its workspace)."""
    details = f"{task}\n\nworkspace: `{workspace}`" if workspace else task
    return {"static_summary": task_summary(task), "static_details": details}


def list_query(**filters: str | None) -> str:
    """A visibility query over refloop's attributes, for `client.list_workflows` (the API's
    task list can use it where the server has visibility): list_query(status="completed",
    session_id="s1") -> "RefloopStatus = 'completed' AND RefloopSessionId = 's1'"."""
    names = {"status": STATUS.name, "kind": KIND.name, "session_id": SESSION_ID.name,
             "intent": INTENT.name}
    clauses = []
    for key, value in filters.items():
        if value is None:
            continue
        if key not in names:
            raise ValueError(f"no search attribute for {key!r}")
        quoted = value.replace("\\", "\\\\").replace("'", "\\'")
        clauses.append(f"{names[key]} = '{quoted}'")
    return " AND ".join(clauses)


# One name per kind: the `RefloopKind` values (durable in Temporal's visibility store and
# in saved Web UI filters) are the names the API, console and documents use. Task rows keep
# their stored `agent` for agent tasks; `kind_name` says it the one way.
AGENT_TASK, SUPPLEMENT, CODE_REVIEW = "agent_task", "supplement", "code_review"
STORED_KINDS = {AGENT_TASK: "agent", CODE_REVIEW: "code_review"}


def kind_name(stored: str) -> str:
    """A task row's kind as RefloopKind says it ('agent' -> 'agent_task')."""
    return AGENT_TASK if stored == "agent" else stored
