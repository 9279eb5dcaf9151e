"""Pydantic models shared by workflows, activities, the API and the CLI.

Everything that crosses a Temporal boundary (activity input/result, workflow
input/result, queries) is one of these models, so fields can be added later
without breaking workflows already in flight: new fields must be optional.
"""

from __future__ import annotations

import functools
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, Field

COMPLETE_STEP = "complete_step"  # the built-in that marks a plan step done


class Purpose(str, Enum):
    """Value of the `X-Refloop-Purpose` header; routing and test doubles key on it."""

    intent = "intent"
    plan = "plan"
    act = "act"
    quality_review = "quality_review"
    completeness = "completeness"
    supplement_plan = "supplement_plan"
    code_review = "code_review"
    code_verify = "code_verify"
    summary = "summary"


# ---------------------------------------------------------------- chat


class ToolCall(BaseModel):
    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class TokenUsage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    calls: int = 0  # HTTP requests, answered or not
    failed_calls: int = 0  # of those: errors, timeouts, cut-off or unusable answers
    # Of the failed: requests whose answer never arrived (client timeout, cancelled or
    # killed attempt). The server may still have generated for them, so their usage is
    # unknown; `abandoned_max_tokens` (the sum of their caps) bounds its completion tokens.
    abandoned_calls: int = 0
    abandoned_max_tokens: int = 0

    def add(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
            calls=self.calls + other.calls,
            failed_calls=self.failed_calls + other.failed_calls,
            abandoned_calls=self.abandoned_calls + other.abandoned_calls,
            abandoned_max_tokens=self.abandoned_max_tokens + other.abandoned_max_tokens,
        )


class ToolSpec(BaseModel):
    """What crosses to the model: name, description and JSON schema, never callables."""

    name: str
    description: str
    parameters: dict[str, Any]

    @functools.cached_property
    def wire(self) -> dict[str, Any]:
        """The OpenAI `tools` entry, built once per spec (the registry's specs are shared)."""
        return {"type": "function", "function": self.model_dump()}


# ---------------------------------------------------------------- structured answers


class IntentLabel(str, Enum):
    CODING_TASK = "CODING_TASK"
    CAPABILITY_QUERY = "CAPABILITY_QUERY"
    REPO_ANALYSIS = "REPO_ANALYSIS"
    GENERAL_CHAT = "GENERAL_CHAT"
    UNCERTAIN = "UNCERTAIN"


class IntentResult(BaseModel):
    intent: IntentLabel
    confidence: float = Field(ge=0.0, le=1.0)
    reason: str = ""


class TaskType(str, Enum):
    research = "research"
    creation = "creation"
    data_processing = "data_processing"
    coding = "coding"
    other = "other"


class PlanStep(BaseModel):
    goal: str = Field(min_length=1)
    tool: str = Field(min_length=1)


class Plan(BaseModel):
    task_type: TaskType = TaskType.other
    steps: list[PlanStep] = Field(min_length=1)


# ---------------------------------------------------------------- activity I/O


class LLMUsageRecord(BaseModel):
    purpose: Purpose
    model: str
    usage: TokenUsage


class ModelEndpoint(BaseModel):
    """A task's own model endpoint (a stored model config). The key is never here: only
    the NAME of the worker's environment variable that holds it."""

    model: str
    base_url: str | None = None
    api_key_env: str | None = None
    temperature: float | None = None


class ClassifyIntentInput(BaseModel):
    task: str
    model: str | None = None
    endpoint: ModelEndpoint | None = None  # a model config's endpoint


class ClassifyIntentResult(BaseModel):
    intent: IntentResult
    usage: LLMUsageRecord


class MakePlanInput(BaseModel):
    task: str
    # Tool names only: the activity looks the specs up, keeping them out of the history.
    tool_names: list[str] = Field(default_factory=list)
    model: str | None = None
    endpoint: ModelEndpoint | None = None  # a model config's endpoint
    feedback: str | None = None  # violations of a previous plan, for a bounded re-plan
    mcp_tools_ref: str | None = None  # blob of the task's MCP tool specs


class ToolConstraints(BaseModel):
    """Task-type constraints: what the task type allows (guides planning) and forbids (enforced)."""

    task_type: str | None = None
    allowed: list[str] = Field(default_factory=list)  # empty: no guidance
    forbidden: list[str] = Field(default_factory=list)
    generation_tools: list[str] = Field(default_factory=list)  # only in the final step(s)


class MakePlanResult(BaseModel):
    plan: Plan
    usage: LLMUsageRecord
    constraints: ToolConstraints | None = None  # None for runs before task-type constraints


class ActInput(BaseModel):
    # History-lean: the conversation so far lives in the blob store under this ref; only
    # the turns added since the last act travel in `messages`.
    messages: list[ChatMessage]
    tool_names: list[str] = Field(default_factory=list)  # specs resolved by the activity
    mcp_tools_ref: str | None = None  # blob of the task's MCP tool specs (MCP names)
    conversation_ref: str | None = None
    max_history_messages: int = 30
    model: str | None = None
    endpoint: ModelEndpoint | None = None  # a model config's endpoint
    parallel_tool_calls: bool | None = None


class ActResult(BaseModel):
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    finish_reason: str | None = None
    abnormal: str | None = None  # set when the output was runaway repetition
    usage: LLMUsageRecord
    conversation_ref: str | None = None  # the stored conversation this answer replied to


class SummarizeInput(BaseModel):
    task: str
    transcript: str
    model: str | None = None
    endpoint: ModelEndpoint | None = None  # a model config's endpoint


class SummarizeResult(BaseModel):
    summary: str
    usage: LLMUsageRecord


class ToolResult(BaseModel):
    ok: bool
    output: str = ""
    error: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)


class RunToolInput(BaseModel):
    call_id: str  # deterministic: the idempotency key of the edit journal
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    workspace: str
    allow_network: bool = False
    allow_shell_operators: bool = False  # ; && || ` $() in run_cmd (off: one command per call)
    # The task's keywords: long read/grep/search outputs are windowed around them.
    keywords: list[str] = Field(default_factory=list)


class QualityReviewInput(BaseModel):
    task: str
    workspace: str
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    data: dict[str, Any] = Field(default_factory=dict)  # the edit tool's result data
    rules: str
    model: str | None = None
    endpoint: ModelEndpoint | None = None  # a model config's endpoint
    snippet_lines: int = 200


class QualityReview(BaseModel):
    """One review of one edit; `outcome` says how the verdict was reached."""

    file_path: str
    passed: bool
    outcome: Literal["passed", "failed", "deterministic_failed", "unavailable"]
    reasons: list[str] = Field(default_factory=list)
    suggestions: str = ""
    summary: str = ""
    tool: str = ""
    start_line: int | None = None
    end_line: int | None = None


class QualityReviewResult(BaseModel):
    review: QualityReview
    usage: LLMUsageRecord | None = None  # None when no model was called


class Supplement(BaseModel):
    action: str
    reason: str = ""
    suggested_tools: list[str] = Field(default_factory=list)


class CompletenessVerdict(BaseModel):
    """The completeness judge's JSON."""

    is_complete: bool
    analysis: str = ""
    missing_aspects: list[str] = Field(default_factory=list)
    supplements: list[Supplement] = Field(default_factory=list)


class HistoryItem(BaseModel):
    tool: str
    arguments: str
    outcome: str


class ToolRecord(BaseModel):
    """One tool call as the completeness judge and a supplement child see it: short
    arguments and outcome, never raw output. The workflow keeps one per call for the whole
    task (continue-as-new trims events, not these)."""

    tool: str
    arguments: str  # JSON, cut short
    ok: bool
    outcome: str
    file_path: str | None = None  # the file a successful edit touched
    note: str = ""  # complete_step's summary (cut short): what the model says it did


class CompletenessInput(BaseModel):
    task: str
    workspace: str
    history: list[HistoryItem]
    tool_names: list[str]
    claimed_files: list[str] = Field(default_factory=list)
    missing_steps: list[str] = Field(default_factory=list)
    final_answer: str = ""
    model: str | None = None
    endpoint: ModelEndpoint | None = None  # a model config's endpoint
    max_supplements: int = 3


class CompletenessResult(BaseModel):
    verdict: CompletenessVerdict
    evidence: list[str] = Field(default_factory=list)  # deterministic findings, for the judge
    # The findings that make the task incomplete on their own (claimed files missing).
    decisive: list[str] = Field(default_factory=list)
    fail_open: bool = False  # the judge's answer could not be parsed: counted complete
    usage: LLMUsageRecord | None = None


class SupplementPlanInput(BaseModel):
    objective: str
    tool_names: list[str]
    mcp_tools_ref: str | None = None  # blob of the task's MCP tool specs
    completed_steps: list[str] = Field(default_factory=list)
    model: str | None = None
    endpoint: ModelEndpoint | None = None  # a model config's endpoint


class ApprovalDecision(BaseModel):
    """Body of the approval update: the `call_id` of an `approval_required` event."""

    call_id: str
    approved: bool
    comment: str | None = None


class RecordQualityReviewInput(BaseModel):
    task_id: str
    review_key: str  # deterministic per review: a retried write never duplicates a row
    session_id: str | None = None
    review: QualityReview


# ---------------------------------------------------------------- workflow I/O


class Event(BaseModel):
    seq: int
    type: str
    ts: str
    data: dict[str, Any] = Field(default_factory=dict)


class TriggerConfig(BaseModel):
    """Early-reflection thresholds."""

    enabled: bool = True
    repeat_threshold: int = Field(default=2, ge=2)  # identical (tool, args) calls
    stuck_iterations: int = Field(default=3, ge=2)  # iterations on one plan step
    stuck_tool_executions: int = Field(default=3, ge=1)  # more than this on one step
    slow_window: int = Field(default=2, ge=1)  # iterations without advance or new result
    cooldown_iterations: int = Field(default=3, ge=0)  # before the same trigger fires again
    enforce_constraints: bool = True


class TaskInput(BaseModel):
    task: str = Field(min_length=1)
    workspace: str
    task_id: str | None = None
    session_id: str | None = None
    model: str | None = None
    endpoint: ModelEndpoint | None = None  # a model config's endpoint
    system_prompt: str | None = None
    enable_quality_review: bool = False
    quality_review_rules: str | None = None
    # Which successful tool calls get a review; None: the document-producing tools.
    quality_review_tools: list[str] | None = None
    quality_review_max_rounds: int = Field(default=3, ge=1, le=20)
    quality_review_snippet_lines: int = Field(default=200, ge=10, le=5000)
    enable_reflection: bool = True
    reflection_max_supplements: int = Field(default=3, ge=0, le=10)
    reflection_max_rounds: int = Field(default=2, ge=1, le=5)  # completeness checks in total
    # Set for a supplement child: it runs this plan with the parent's context, no reflection.
    is_supplement: bool = False
    preset_plan: Plan | None = None
    prior_context: str | None = None
    enable_planning: bool = True
    allow_network: bool = False
    allow_shell_operators: bool = False
    # auto | confirm_writes (writes and run_cmd wait for a decision) | confirm_all
    approval_mode: Literal["auto", "confirm_writes", "confirm_all"] = "auto"
    approval_timeout_s: float = Field(default=600.0, gt=0)  # no decision = rejection
    max_iterations: int = Field(default=20, ge=1, le=500)
    # Stop cleanly once the task (children included) has spent this many tokens.
    token_budget: int | None = Field(default=None, gt=0)
    # Continue-as-new at a step boundary past this many history events (0: only when
    # Temporal suggests it; the test server never does).
    continue_as_new_after_events: int = Field(default=0, ge=0)
    # Set by continue-as-new: the previous run's AgentState, resumed as is.
    resume_state: dict[str, Any] | None = None
    triggers: TriggerConfig = Field(default_factory=lambda: TriggerConfig())
    max_history_messages: int = Field(default=30, ge=4)
    # MCP servers (names in REFLOOP_MCP_CONFIG) whose tools this task may call; none: none.
    mcp_servers: list[str] = Field(default_factory=list, max_length=16)


class WorkspaceInput(BaseModel):
    workspace: str


class WorkspaceDescription(BaseModel):
    """Environment and repo map for the system prompt; whether to index in the background."""

    context: str
    index_available: bool = False


class IndexReport(BaseModel):
    """What one incremental indexing pass did."""

    available: bool = True
    files_seen: int = 0
    files_indexed: int = 0  # new or changed: chunked and embedded
    files_unchanged: int = 0
    files_removed: int = 0
    chunks_embedded: int = 0
    chunks_total: int = 0
    seconds: float = 0.0
    note: str | None = None


class SemanticHit(BaseModel):
    path: str
    start_line: int
    end_line: int
    text: str
    score: float


class ReviewCounts(BaseModel):
    total: int = 0
    passed: int = 0
    failed: int = 0
    unavailable: int = 0


class TaskStats(BaseModel):
    iterations: int = 0
    llm_calls: int = 0
    llm_failed_calls: int = 0  # requests that errored, timed out or were cut off
    tool_calls: int = 0
    tool_errors: int = 0
    reviews: ReviewCounts = Field(default_factory=ReviewCounts)
    usage: TokenUsage = Field(default_factory=TokenUsage)
    usage_by_purpose: dict[str, TokenUsage] = Field(default_factory=dict)
    usage_by_model: dict[str, TokenUsage] = Field(default_factory=dict)  # the cost ledger


class TaskResult(BaseModel):
    task_id: str
    workflow_id: str
    # incomplete: ran to the end, but the work is not done (no successful edit where the
    # plan required one, or the last completeness verdict still found gaps); see `missing`
    status: Literal["completed", "incomplete", "failed"]
    stop_reason: str
    answer: str
    missing: list[str] = Field(default_factory=list)
    summary: str | None = None
    intent: IntentResult | None = None
    plan: Plan | None = None
    completed_steps: list[int] = Field(default_factory=list)
    events: list[Event] = Field(default_factory=list)
    stats: TaskStats = Field(default_factory=TaskStats)
    quality_reviews: list[QualityReview] = Field(default_factory=list)
    supplements: list[dict[str, Any]] = Field(default_factory=list)  # one per child run
    tool_violations: list[dict[str, Any]] = Field(default_factory=list)
    allowed_tools_snapshot: list[str] = Field(default_factory=list)


class TaskProgress(BaseModel):
    """Answer of the `progress` query: enough for a live view without the DB."""

    status: str
    current_step: int | None = None
    plan: Plan | None = None
    stats: TaskStats
    event_count: int


class RecordTaskInput(BaseModel):
    task_id: str
    workflow_id: str
    kind: str = "agent"
    session_id: str | None = None
    status: str
    input: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    error: str | None = None
