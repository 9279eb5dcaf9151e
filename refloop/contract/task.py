"""A task as workflows, the API and the CLI see it: its input, events, progress and
result. Everything that crosses a Temporal boundary is a pydantic model, so fields can be
added later without breaking workflows in flight: new fields must be optional.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from refloop.contract.activity_io import ModelEndpoint, QualityReview
from refloop.contract.approvals import APPROVAL_TIMEOUT_S
from refloop.contract.budget import BudgetState
from refloop.contract.checkpoints import ForkOrigin
from refloop.contract.handover import HandedOver
from refloop.contract.hosts import HOST_ID_PATTERN
from refloop.contract.messages import IntentResult, Plan, TokenUsage

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
    # A workspace checkpoint after each call that may change it (stored in the shared store:
    # a step's files can be put back on any host)
    checkpoints: bool = True
    allow_network: bool = False
    allow_shell_operators: bool = False
    # auto | confirm_writes (writes and run_cmd wait for a decision) | confirm_all
    approval_mode: Literal["auto", "confirm_writes", "confirm_all"] = "auto"
    # How long a call waits for a person's decision; unanswered, the task ends incomplete
    # naming it (REFLOOP_APPROVAL_TIMEOUT_S: 3 days, the default of tasks started without)
    approval_timeout_s: float = Field(default=APPROVAL_TIMEOUT_S, gt=0)
    max_iterations: int = Field(default=20, ge=1, le=500)
    # The task's spend limit, its children's spend included (refloop/contract/budget.py):
    # before a model call the limit does not cover, the task waits `waiting_for_budget`
    # until it is raised, `budget_wait_s` at most (None: 7 days), then ends incomplete.
    # `token_budget`, the earlier name of `max_tokens`, is still read (for a release).
    max_cost_usd: float | None = Field(default=None, gt=0)
    max_tokens: int | None = Field(default=None, gt=0)
    budget_wait_s: float | None = Field(default=None, gt=0)
    # Continue-as-new at a step boundary past this many history events (0: only when
    # Temporal suggests it; the test server never does).
    continue_as_new_after_events: int = Field(default=0, ge=0)
    # Set by continue-as-new: the previous run's AgentState, resumed as is.
    resume_state: dict[str, Any] | None = None
    triggers: TriggerConfig = Field(default_factory=lambda: TriggerConfig())
    # A ceiling rarely reached: the model's window decides what the model reads
    # (refloop.llm.fitting); it was 30, which cut a long task's early facts
    max_history_messages: int = Field(default=400, ge=4)
    # MCP servers (names in REFLOOP_MCP_CONFIG) whose tools this task may call; none: none.
    mcp_servers: list[str] = Field(default_factory=list, max_length=16)
    # The worker host holding the workspace (REFLOOP_HOST_ID); its workspace activities run
    # on that host's task queue. Added later, optional: None keeps one host for everything.
    host: str | None = Field(default=None, pattern=HOST_ID_PATTERN)
    # How long a worker of the host may take to pick a workspace call up before the task
    # shows `waiting_for_host` (None: 60 s).
    host_wait_s: float | None = Field(default=None, gt=0)
    # A fork of another task at one of its steps (`refloop fork`); added later, optional:
    # None is a task of its own, as before
    fork: ForkOrigin | None = None
    # Set by a hand-over to a new build: the run waits, recording nothing, until a worker
    # of another build takes it over (refloop.contract.handover)
    handed_over: HandedOver | None = None

    @model_validator(mode="before")
    @classmethod
    def _token_budget_is_max_tokens(cls, data: Any) -> Any:
        """`token_budget` (the earlier name) is `max_tokens`."""
        if isinstance(data, dict) and "token_budget" in data:
            data = dict(data)
            budget = data.pop("token_budget")
            if data.get("max_tokens") is None:
                data["max_tokens"] = budget
        return data


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
    # found by a word scan of a file the index does not hold yet (its first pass runs)
    unindexed: bool = False


class SearchAnswer(BaseModel):
    """Code search's answer: the hits, and while an indexing pass runs, what they miss."""

    hits: list[SemanticHit]
    partial: bool = False  # some files are not indexed yet (their word-scan hits included)
    note: str | None = None


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
    # Seconds model calls waited out an endpoint outage (`waiting_for_model`); new, so
    # runs recorded before it read 0.
    model_wait_s: float = 0.0
    host_wait_s: float = 0.0  # seconds waited for the task's host (`waiting_for_host`)
    # Of `usage` (and `usage_by_model`): the cost of calls a rewind took out of the run,
    # still paid for; new, so runs recorded before it read 0
    rewound_usage: TokenUsage = Field(default_factory=TokenUsage)
    rewound_by_model: dict[str, TokenUsage] = Field(default_factory=dict)
    # Of `usage`: what its supplement children spent (the rest, the task's own); new, so
    # runs recorded before it read 0
    children_usage: TokenUsage = Field(default_factory=TokenUsage)


# The signal a model activity sends its task when its call starts waiting for the
# endpoint, and when the endpoint answers again.
MODEL_WAIT_SIGNAL = "model_wait"


class ModelWaitReport(BaseModel):
    """`waiting`: the call waits for `endpoint` since `since` (epoch seconds), its last
    `error`; else the endpoint answered after `waited_s`, or the call gave up then."""

    waiting: bool
    endpoint: str
    error: str | None = None
    since: float | None = None
    waited_s: float | None = None
    gave_up: bool = False  # past REFLOOP_MODEL_OUTAGE_S: the call fails next


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
    # The recent violations (a long task's earlier ones are its `tool_violation` events);
    # `tool_violations_left_out` says how many more there were (new, so earlier results,
    # which carried them all, read 0)
    tool_violations: list[dict[str, Any]] = Field(default_factory=list)
    tool_violations_left_out: int = 0
    allowed_tools_snapshot: list[str] = Field(default_factory=list)
    # Successful edits of the run and its children, counted in its state (its events may
    # be trimmed); None from earlier code, whose parent then counts them in `events`
    edits_ok: int | None = None


class TaskProgress(BaseModel):
    """Answer of the `progress` query: enough for a live view without the DB."""

    status: str
    current_step: int | None = None
    plan: Plan | None = None
    stats: TaskStats
    event_count: int
    budget: BudgetState | None = None  # its spend limit now; None: it has none


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
    # What the task waits for now, by kind ({"model": {"status", "since", "reason", ...}});
    # empty: it waits for nothing. Always written: the row follows the workflow.
    waiting: dict[str, Any] = Field(default_factory=dict)
