"""The agent workflow's state: one pydantic model, so it crosses continue-as-new whole.

Plain data with no workflow code, so the worker passes this module through the sandbox
instead of rebuilding the model's schema for every workflow run.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, model_validator

from refloop.mcp_config import McpToolInfo
from refloop.models import (
    ApprovalDecision,
    ChatMessage,
    Event,
    IntentResult,
    Plan,
    QualityReview,
    TaskInput,
    TaskStats,
    ToolConstraints,
    ToolRecord,
)
from workflows.completeness_logic import records_from_events
from workflows.triggers import LoopRecord, TriggerState


class AgentState(BaseModel):
    """Everything the workflow knows; one object so it can cross continue-as-new whole."""

    input: TaskInput
    task_id: str
    status: str = "running"
    intent: IntentResult | None = None
    plan: Plan | None = None
    completed_steps: list[int] = Field(default_factory=list)
    # History-lean: the conversation lives in the blob store; only new turns wait here.
    conversation_ref: str | None = None
    pending: list[ChatMessage] = Field(default_factory=list)
    events: list[Event] = Field(default_factory=list)
    # One compact record per tool call, for the whole task: continue-as-new trims `events`
    tool_ledger: list[ToolRecord] = Field(default_factory=list)
    last_seq: int = 0  # event numbering survives continue-as-new, which trims `events`
    stats: TaskStats = Field(default_factory=TaskStats)
    answer: str = ""
    summary: str | None = None
    quality_reviews: list[QualityReview] = Field(default_factory=list)
    review_failures: dict[str, int] = Field(default_factory=dict)  # per file, for the cap
    review_capped: list[str] = Field(default_factory=list)
    supplements: list[dict[str, Any]] = Field(default_factory=list)
    # Constraints of the inferred task type, violations, early-reflection state
    constraints: ToolConstraints | None = None
    tool_violations: list[dict[str, Any]] = Field(default_factory=list)
    exceptions_used: list[str] = Field(default_factory=list)
    loop_records: list[LoopRecord] = Field(default_factory=list)
    trigger_state: TriggerState = Field(default_factory=TriggerState)
    step_started: int = 1  # iteration at which the current plan step began
    # Environment and repo map for the system prompt
    workspace_context: str | None = None
    # call key -> decision (None while waiting); the update validator reads it
    pending_approvals: dict[str, ApprovalDecision | None] = Field(default_factory=dict)
    # The chosen MCP servers' tools, listed once at task start (by model-facing name)
    mcp_tools: dict[str, McpToolInfo] = Field(default_factory=dict)
    mcp_tools_ref: str | None = None
    # Honest outcomes: successful edits (children's included); a question answered without
    # tools after its plan failed
    edits_ok: int = 0
    direct_answer: bool = False

    @model_validator(mode="before")
    @classmethod
    def _accept_earlier_shapes(cls, data: Any) -> Any:
        """State carried by runs of older code: its tool calls are only in its events."""
        if isinstance(data, dict) and "tool_ledger" not in data and data.get("events"):
            events = [Event.model_validate(e) for e in data["events"]]
            data = {**data, "tool_ledger": records_from_events(events)}
        return data
