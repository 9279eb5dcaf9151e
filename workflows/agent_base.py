"""State, event and accounting helpers shared by the agent workflow and its phases."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.exceptions import ApplicationError, CancelledError

# Models are plain data; passed through so the sandbox does not re-import pydantic.
with workflow.unsafe.imports_passed_through():
    from refloop.models import (
        ActivityName,
        ApprovalDecision,
        ChatMessage,
        Event,
        IntentResult,
        LLMUsageRecord,
        Plan,
        QualityReview,
        RecordTaskInput,
        TaskInput,
        TaskStats,
        ToolConstraints,
    )

from workflows import logic
from workflows.policies import STORE_WRITE
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
    last_seq: int = 0  # event numbering survives continue-as-new, which trims `events`
    stats: TaskStats = Field(default_factory=TaskStats)
    answer: str = ""
    summary: str | None = None
    quality_reviews: list[QualityReview] = Field(default_factory=list)
    review_failures: dict[str, int] = Field(default_factory=dict)  # per file, for the cap
    review_capped: list[str] = Field(default_factory=list)
    supplements: list[dict[str, Any]] = Field(default_factory=list)
    # seed 001: constraints of the inferred task type, violations, early-reflection state
    constraints: ToolConstraints | None = None
    tool_violations: list[dict[str, Any]] = Field(default_factory=list)
    exceptions_used: list[str] = Field(default_factory=list)
    loop_records: list[LoopRecord] = Field(default_factory=list)
    trigger_state: TriggerState = Field(default_factory=TriggerState)
    step_started: int = 1  # iteration at which the current plan step began
    # Environment and repo map for the system prompt (seed 002 §1.2)
    workspace_context: str | None = None
    # call key -> decision (None while waiting); the update validator reads it
    pending_approvals: dict[str, ApprovalDecision | None] = Field(default_factory=dict)


class TaskFailed(Exception):
    """Internal: ends the run as failed with a stop reason and message."""

    def __init__(self, stop_reason: str, message: str) -> None:
        super().__init__(message)
        self.stop_reason = stop_reason
        self.message = message


class AgentBase:
    """Helpers over `self.state`; the workflow class and its phase mixins share them."""

    state: AgentState

    async def _record(self, status: str, **fields: Any) -> None:
        await workflow.execute_activity(
            ActivityName.RECORD_TASK,
            RecordTaskInput(
                task_id=self.state.task_id,
                workflow_id=workflow.info().workflow_id,
                session_id=self.state.input.session_id,
                status=status,
                usage=self.state.stats.model_dump(mode="json"),
                **fields,
            ),
            summary=f"record task {status}",
            **STORE_WRITE.kwargs(),
        )

    def _append(self, message: ChatMessage) -> None:
        """A turn for the next `act`, which adds it to the stored conversation and trims."""
        self.state.pending.append(message)

    def _account(self, record: LLMUsageRecord) -> None:
        self.state.stats = logic.add_usage(self.state.stats, record)

    def _emit(self, event_type: str, data: dict[str, Any]) -> None:
        self.state.last_seq += 1
        self.state.events.append(
            Event(
                seq=self.state.last_seq,
                type=event_type,
                ts=workflow.now().isoformat(),
                data=data,
            )
        )

    def _emit_step(self) -> None:
        step = logic.current_step(self.state.plan, self.state.completed_steps)
        if self.state.plan is not None:
            goal = self.state.plan.steps[step - 1].goal if step else None
            self._emit(
                "step",
                {"step": step, "goal": goal, "completed": self.state.completed_steps},
            )


def raise_if_cancelled(err: BaseException) -> None:
    """A cancelled run surfaces as an activity/child error caused by cancellation; it must
    end the run as cancelled, never be swallowed by a fail-open branch."""
    if isinstance(err.__cause__, CancelledError) or isinstance(
        getattr(err, "cause", None), CancelledError
    ):
        raise asyncio.CancelledError() from err


def describe_failure(err: BaseException) -> str:
    """The first application error's message (our activities word those for users),
    else the innermost failure."""
    cause: BaseException | None = err
    message = str(err)
    while cause is not None:
        if isinstance(cause, ApplicationError):
            return f"{cause.type}: {cause.message}" if cause.type else cause.message
        if str(cause):
            message = str(cause)
        cause = cause.__cause__
    return message
