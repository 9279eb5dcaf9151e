"""The agent workflow's state: one pydantic model, so it crosses continue-as-new whole.

Grouped by owner: each group is written by one part of the workflow (named on the group)
and only read by the others. `stats` is shared: it is replaced, never changed in place.

Plain data with no workflow code, so the worker passes this module through the sandbox
instead of rebuilding the model's schema for every workflow run.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, model_validator

from refloop.contract.activity_io import (
    ApprovalDecision,
    QualityReview,
    ToolConstraints,
    ToolRecord,
)
from refloop.contract.mcp import McpToolInfo
from refloop.contract.messages import ChatMessage, IntentResult, Plan, ToolCall
from refloop.contract.task import Event, TaskInput, TaskStats
from refloop.contract.tool_properties import ToolProperties
from refloop.workflows.completeness_logic import records_from_events
from refloop.workflows.triggers import LoopRecord, TriggerState


def _counted(data: Any, count: str, items: str) -> Any:
    """State carried by earlier code, which kept every item in a list that is now the recent
    ones: its count is that list's length."""
    if isinstance(data, dict) and count not in data:
        return {**data, count: len(data.get(items) or [])}
    return data


class PlanState(BaseModel):
    """Intent, plan and progress through it (the agent loop)."""

    intent: IntentResult | None = None
    plan: Plan | None = None
    completed_steps: list[int] = Field(default_factory=list)
    step_started: int = 1  # iteration at which the current plan step began
    constraints: ToolConstraints | None = None  # of the inferred task type
    direct_answer: bool = False  # a question answered without tools after its plan failed


class ConversationState(BaseModel):
    """The model conversation (the agent loop). History-lean: it lives in the blob store;
    only turns not yet sent to the model wait here."""

    ref: str | None = None
    unsent_turns: list[ChatMessage] = Field(default_factory=list)
    answer: str = ""
    summary: str | None = None


class TurnState(BaseModel):
    """A model turn whose calls are being run: a run handed over mid-turn (waiting for an
    approval or a host) goes on from `next_index` in the next run."""

    iteration: int
    structured: bool
    calls: list[ToolCall]
    next_index: int = 0
    reviews: list[QualityReview] = Field(default_factory=list)


class CallsState(BaseModel):
    """What the tool calls did (the agent loop's tool step and its early reflection)."""

    # One compact record per call, for the whole task: continue-as-new trims `events`
    ledger: list[ToolRecord] = Field(default_factory=list)
    # A long task's earlier records, kept in the blob store (oldest first): the ledger then
    # holds only the calls since, so the state stays small at any length
    ledger_refs: list[str] = Field(default_factory=list)
    kept_calls: int = 0  # records in `ledger_refs`
    # What their complete_step summaries claim: the files they say were written, one
    # sentence each, the recent ones (`completeness_logic.kept_claims`); the summaries
    # whole in state carried by earlier code
    kept_notes: list[str] = Field(default_factory=list)
    # The recent violations of the task type's constraints (each is a `tool_violation`
    # event), and a count of them all; state carried by earlier code kept them all
    violations: list[dict[str, Any]] = Field(default_factory=list)
    violation_count: int = 0
    justified_tools: list[str] = Field(default_factory=list)  # forbidden, excused once
    edits_ok: int = 0  # successful edits, for honest outcomes
    # Successful calls that may change the workspace, by tool, for honest outcomes; None in
    # state carried by earlier code (its calls are then only in its trimmed events)
    changes: dict[str, int] | None = None
    turn: TurnState | None = None  # the turn in progress (None between turns)
    loop_records: list[LoopRecord] = Field(default_factory=list)
    triggers: TriggerState = Field(default_factory=TriggerState)

    @model_validator(mode="before")
    @classmethod
    def _count_violations(cls, data: Any) -> Any:
        return _counted(data, "violation_count", "violations")


class ReviewsState(BaseModel):
    """Quality reviews of this task's edits (QualityReviewPhase)."""

    # The recent reviews, for the result (every one is in the quality_reviews table)
    done: list[QualityReview] = Field(default_factory=list)
    # Every review of the task, for its key in that table; state carried by earlier code
    # kept them all in `done` (see `_count_from_done`)
    count: int = 0
    # Failed reviews per file not yet capped, and the files that reached the cap; the
    # recent files only (`review_logic.remember_failure`), all of them in earlier runs
    failures: dict[str, int] = Field(default_factory=dict)
    capped: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _count_from_done(cls, data: Any) -> Any:
        return _counted(data, "count", "done")


class ReflectionState(BaseModel):
    """Completeness reflection's supplement children and what they did (CompletenessPhase)."""

    supplements: list[dict[str, Any]] = Field(default_factory=list)
    edits_ok: int = 0
    reviews: list[QualityReview] = Field(default_factory=list)
    last_verdict: dict[str, Any] | None = None  # the last completeness check's event data


class ApprovalsState(BaseModel):
    """Calls waiting for a human (ApprovalPhase)."""

    # call key -> decision (None while waiting); the update validator reads it. A decision
    # leaves once its call has read it (kept for good by runs recorded before that)
    waiting: dict[str, ApprovalDecision | None] = Field(default_factory=dict)


class McpState(BaseModel):
    """The chosen MCP servers' tools, listed once at task start (McpPhase)."""

    tools: dict[str, McpToolInfo] = Field(default_factory=dict)  # by model-facing name
    specs_ref: str | None = None


class WorkspaceState(BaseModel):
    """Environment and repo map for the system prompt (WorkspacePhase)."""

    context: str | None = None
    last_checkpoint: str | None = None  # the latest checkpoint of the workspace, if any
    rewind_to: str | None = None  # a checkpoint to restore before the next call
    # A call whose checkpoint failed: taken again before the next call, and no move (which
    # restores the latest checkpoint elsewhere) is accepted until it is
    unsaved_call: str | None = None
    indexing: bool = False  # the task indexes its workspace: each later run goes on with it


# Where each field of the earlier flat state went: old name -> (group, new name).
_FLAT_FIELDS: dict[str, tuple[str, str]] = {
    "intent": ("planning", "intent"),
    "plan": ("planning", "plan"),
    "completed_steps": ("planning", "completed_steps"),
    "step_started": ("planning", "step_started"),
    "constraints": ("planning", "constraints"),
    "direct_answer": ("planning", "direct_answer"),
    "conversation_ref": ("conversation", "ref"),
    "pending": ("conversation", "unsent_turns"),
    "answer": ("conversation", "answer"),
    "summary": ("conversation", "summary"),
    "tool_ledger": ("calls", "ledger"),
    "tool_violations": ("calls", "violations"),
    "exceptions_used": ("calls", "justified_tools"),
    "edits_ok": ("calls", "edits_ok"),
    "loop_records": ("calls", "loop_records"),
    "trigger_state": ("calls", "triggers"),
    "quality_reviews": ("reviews", "done"),
    "review_failures": ("reviews", "failures"),
    "review_capped": ("reviews", "capped"),
    "supplements": ("reflection", "supplements"),
    "pending_approvals": ("approvals", "waiting"),
    "mcp_tools": ("mcp", "tools"),
    "mcp_tools_ref": ("mcp", "specs_ref"),
    "workspace_context": ("workspace", "context"),
}


def _grouped(data: dict[str, Any]) -> dict[str, Any]:
    """The earlier flat state in groups (children's edits and reviews stay in the run's
    own counts, which the result adds up the same way)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key in _FLAT_FIELDS:
            group, name = _FLAT_FIELDS[key]
            out.setdefault(group, {})[name] = value
        else:
            out[key] = value
    return out


class Wait(BaseModel):
    """One kind of wait the task is in (`AgentState.waits`): what it waits for, why, since
    when. Each kind is set and cleared by its own phase only."""

    status: str  # waiting_for_host, waiting_for_model, ...
    since: str  # ISO time
    reason: str = ""
    detail: dict[str, Any] = Field(default_factory=dict)


class AgentState(BaseModel):
    """Everything the workflow knows; one object so it can cross continue-as-new whole."""

    input: TaskInput
    task_id: str
    status: str = "running"  # the run's endings
    # The waits the task is in, by kind ("host", "model"); approvals are in `approvals`
    waits: dict[str, Wait] = Field(default_factory=dict)
    events: list[Event] = Field(default_factory=list)  # any part, through `_emit`
    last_seq: int = 0  # event numbering survives continue-as-new, which trims `events`
    stats: TaskStats = Field(default_factory=TaskStats)
    planning: PlanState = Field(default_factory=PlanState)
    conversation: ConversationState = Field(default_factory=ConversationState)
    calls: CallsState = Field(default_factory=CallsState)
    reviews: ReviewsState = Field(default_factory=ReviewsState)
    reflection: ReflectionState = Field(default_factory=ReflectionState)
    approvals: ApprovalsState = Field(default_factory=ApprovalsState)
    mcp: McpState = Field(default_factory=McpState)
    workspace: WorkspaceState = Field(default_factory=WorkspaceState)
    # The built-in tools this task uses, fixed at its start (None: read from the code, as
    # runs recorded before did)
    tools: dict[str, ToolProperties] | None = None

    @model_validator(mode="before")
    @classmethod
    def _accept_earlier_shapes(cls, data: Any) -> Any:
        """State carried over by runs of earlier code: flat, and without the tool ledger
        (its tool calls are then only in its events)."""
        if not isinstance(data, dict):
            return data
        if "conversation" not in data:
            data = _grouped(data)
        calls = data.get("calls") or {}
        if "ledger" not in calls and data.get("events"):
            events = [Event.model_validate(e) for e in data["events"]]
            data = {**data, "calls": {**calls, "ledger": records_from_events(events)}}
        return data

    @property
    def all_edits_ok(self) -> int:
        """Successful edits of this run and its supplement children."""
        return self.calls.edits_ok + self.reflection.edits_ok

    @property
    def all_reviews(self) -> list[QualityReview]:
        return self.reviews.done + self.reflection.reviews
