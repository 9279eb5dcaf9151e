"""Request and response bodies of the HTTP API (stored tables stay in refloop.store)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict

from refloop.contract.hosts import HOST_ID_PATTERN
from refloop.contract.task import TaskProgress
from refloop.runtime.workspaces import ID_PATTERN

ApprovalMode = Literal["auto", "confirm_writes", "confirm_all"]
McpServerName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")]
DB_ID_MAX = 2_147_483_647  # PostgreSQL INTEGER: a larger key can name no row


def _integral_float(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


# Request bodies are strict (no "1" for 1, no 0 for false), but JSON's 5.0 is the integer 5.
JsonInt = Annotated[int, BeforeValidator(_integral_float), Strict()]
DbId = Annotated[JsonInt, Field(ge=1, le=DB_ID_MAX)]
APPROVAL_WAIT_MAX_S = 366 * 24 * 3600.0  # a year: Temporal's timers take far more
# A number: JSON's 5 is 5.0, "5" and true are refused. No validator before the bounds a
# field sets: the document states them then (after a validator it would not).
JsonFloat = Annotated[float, Strict()]
# A spend limit: dollars, or tokens (bounded: a JSON number a browser still reads exactly)
LimitUsd = Annotated[float, Strict(), Field(gt=0, le=1e9)]
LimitTokens = Annotated[int, Field(gt=0, le=10**15), BeforeValidator(_integral_float),
                        Strict()]
SafeId = Annotated[str, Field(pattern=ID_PATTERN, max_length=128)]


class SessionStart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [{
        "system_prompt": "You are a careful writer.",
        "enable_quality_review": True,
        "quality_review_rules": "Every report needs a Summary section.",
    }]})

    # Inside REFLOOP_WORKSPACE_ROOTS (relative: to the server's start directory);
    # omitted: a fresh directory under <data dir>/workspaces.
    workspace: str | None = Field(default=None, min_length=1, max_length=4096)
    prompt_id: DbId | None = None
    system_prompt: str | None = Field(default=None, max_length=100_000)
    enable_quality_review: bool | None = None  # None: the prompt's setting
    quality_review_rules: str | None = Field(default=None, max_length=100_000)
    model: str | None = Field(default=None, max_length=200)
    model_config_id: DbId | None = None
    approval_mode: ApprovalMode = "auto"
    # How long a call of its tasks waits for a decision, in seconds; None: the operator's
    # REFLOOP_APPROVAL_TIMEOUT_S (3 days), at least a second. Unanswered, the task ends
    # incomplete.
    approval_timeout_s: JsonFloat | None = Field(default=None, ge=1, le=APPROVAL_WAIT_MAX_S)
    # The spend limit its tasks start with, unless a task says otherwise (see TaskCreate);
    # None: the prompt's (prompt_id), if it has one
    max_cost_usd: LimitUsd | None = None
    max_tokens: LimitTokens | None = None
    # MCP servers (REFLOOP_MCP_CONFIG names) the session's tasks use by default
    mcp_servers: list[McpServerName] = Field(default_factory=list, max_length=16)
    # The worker host holding the workspace (GET /hosts); omitted: the one live host whose
    # roots hold it
    host: str | None = Field(default=None, pattern=HOST_ID_PATTERN)


class SessionStarted(BaseModel):
    session_id: str
    host: str | None = None  # the worker host holding the workspace (GET /hosts)


class TaskCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [{
        "session_id": "sess-1a2b3c4d5e6f", "task": "Write report.md summarising data.csv",
        "enable_quality_review": False,
    }]})

    session_id: SafeId
    task: str = Field(min_length=1, max_length=100_000)
    enable_quality_review: bool | None = None  # None: the session's setting
    quality_review_rules: str | None = Field(default=None, max_length=100_000)
    approval_mode: ApprovalMode | None = None
    approval_timeout_s: JsonFloat | None = Field(default=None, ge=1, le=APPROVAL_WAIT_MAX_S)
    enable_reflection: bool | None = None
    max_iterations: JsonInt = Field(default=20, ge=1, le=500)
    # The task's spend limit, its children's spend included; at it the task waits
    # `waiting_for_budget` until POST /tasks/{id}/budget raises it. None: the session's
    # (which is its prompt's when the session names none)
    max_cost_usd: LimitUsd | None = None
    max_tokens: LimitTokens | None = None
    # MCP servers for this task; None: the session's
    mcp_servers: list[McpServerName] | None = Field(default=None, max_length=16)


class TaskAccepted(BaseModel):
    task_id: str
    workflow_id: str


class TaskState(BaseModel):
    task_id: str
    workflow_id: str
    session_id: str | None
    kind: str
    status: str
    progress: TaskProgress | None = None
    result: dict[str, Any] | None = None
    error: str | None = None
    # What it waits for, by kind, with why and since when ({"model": {"status":
    # "waiting_for_model", "since": ..., "reason": "HTTP 503 ...", "detail": {...}}})
    waiting: dict[str, Any] | None = None
    created_at: datetime
    finished_at: datetime | None = None
    # The model the task runs with and the endpoint it goes to (a model config's, else the
    # worker's own)
    model: str | None = None
    endpoint: str | None = None
    # Temporal did not answer in time: the stored row, which may lag behind the task
    from_database: bool = False
    # For a list of tasks at a glance: the task's text, the host holding its workspace,
    # its tokens so far, its run time, and its page in the Temporal Web UI (None: no Web
    # UI known, see REFLOOP_TEMPORAL_UI_URL)
    task: str | None = None
    host: str | None = None
    tokens: int | None = None
    duration_s: float | None = None
    web_ui: str | None = None
    # Forks: the task this one was forked from ({task_id, step}), and (GET /tasks/{id}
    # only) the tasks forked from this one
    forked_from: dict[str, Any] | None = None
    forks: list[dict[str, Any]] = Field(default_factory=list)
    # Spend in USD at REFLOOP_MODEL_PRICES: the task's with its children's, and its own;
    # `unpriced_calls`: answered calls of models with no price (counted in tokens only)
    cost_usd: float | None = None
    own_cost_usd: float | None = None
    unpriced_calls: int = 0
    # Its limit now ({max_cost_usd, max_tokens, cost_usd, tokens, waiting}); None: none
    budget: dict[str, Any] | None = None


class TaskStart(SessionStart):
    """POST /tasks: a task in one call. Without `session_id`, a new session of the fields
    above (as POST /agent/interactive/start); with it, the task joins that session, whose
    workspace, host, prompt and model it keeps."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"task": "Write report.md summarising data.csv", "approval_mode": "confirm_writes"},
        {"task": "Add a Summary section to report.md", "session_id": "sess-1a2b3c4d5e6f",
         "approval_mode": "confirm_writes"}]})

    task: str = Field(min_length=1, max_length=100_000)
    session_id: SafeId | None = None
    enable_reflection: bool | None = None
    max_iterations: JsonInt = Field(default=20, ge=1, le=500)


class TaskStarted(TaskAccepted):
    session_id: str
    host: str | None = None  # the worker host holding the workspace (GET /hosts)


class ApprovalBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    call_id: str = Field(min_length=1, max_length=100)
    approved: bool
    comment: str | None = Field(default=None, max_length=10_000)
    # Approve with these arguments instead of the model's: the call's whole arguments, as
    # its `approval_required` event's `args`; refused (422) where its tool would refuse them
    arguments: dict[str, Any] | None = None


class ApprovalOutcome(BaseModel):
    call_id: str
    outcome: str


class RewindBody(BaseModel):
    """Put a running task back to its Nth workspace checkpoint (counted from 1 in the order
    its current run took them: the `checkpoint` of its `tool_result` events)."""

    model_config = ConfigDict(extra="forbid", strict=True,
                              json_schema_extra={"examples": [{"to_step": 2}]})

    to_step: JsonInt = Field(ge=1, le=1_000_000)


class TaskRewound(BaseModel):
    task_id: str
    step: int
    checkpoint: str
    call_id: str  # the call after which that checkpoint was taken
    run_id: str  # the task's run, which goes on from the step (a rewind starts none)
    edits_taken_back: int
    rewound_tokens: int  # the cost of the calls taken back: kept, marked rewound


class ForkBody(BaseModel):
    """Start a new task from step N of this one (running or ended), in a new workspace put
    back to that step's checkpoint, with its plan and conversation up to there."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"at_step": 4}, {"at_step": 4, "task": "use the other library from here on"}]})

    at_step: JsonInt = Field(ge=1, le=1_000_000)
    # A new instruction, the fork's conversation's last user turn
    task: str | None = Field(default=None, min_length=1, max_length=100_000)
    # The fork's directory on the original's host (None: beside the original's, named
    # `<it>-fork-<id>`); new or empty, under the host's roots
    workspace: str | None = Field(default=None, min_length=1, max_length=4096)


class TaskForked(BaseModel):
    task_id: str  # the fork
    forked_from: str
    step: int
    checkpoint: str
    workspace: str
    host: str | None = None


class MoveBody(BaseModel):
    """Move a task waiting for a host that will never return. Copy its workspace to the new
    host first: at the same path, or at the one `workspace` names there."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"host": "worker-b"}, {"host": "worker-b", "workspace": "/srv/ws/copy"}]})

    host: str = Field(pattern=HOST_ID_PATTERN)
    # The copy's absolute path on the new host (None: the task's path). Only that host's
    # roots check it: the API need not see it.
    workspace: str | None = Field(default=None, min_length=1, max_length=4096)


class TaskMoved(BaseModel):
    task_id: str
    host: str
    moved_from: str | None
    # The workspace on the new host (the same path, unless the move named another).
    workspace: str | None = None


class PromptBase(BaseModel):
    name: str = Field(min_length=1, max_length=200)
    system_prompt: str = Field(min_length=1, max_length=100_000)
    enable_quality_review: bool = False
    quality_review_rules: str | None = Field(default=None, max_length=100_000)
    # The spend limit of the tasks of a session started with this prompt, unless the
    # session or the task names its own (see TaskCreate)
    max_cost_usd: LimitUsd | None = None
    max_tokens: LimitTokens | None = None


class PromptCreate(PromptBase):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [{
        "name": "report writer", "system_prompt": "You write short reports.",
        "enable_quality_review": True, "quality_review_rules": "Use British spelling.",
    }]})


class PromptUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    # Omit a field to keep it; null only where the stored value may be empty.
    name: str = Field(default=None, min_length=1, max_length=200)
    system_prompt: str = Field(default=None, min_length=1, max_length=100_000)
    enable_quality_review: bool = None  # type: ignore[assignment]
    quality_review_rules: str | None = Field(default=None, max_length=100_000)
    max_cost_usd: LimitUsd | None = None  # null: no default limit
    max_tokens: LimitTokens | None = None


class PromptPublic(PromptBase):
    id: int
    created_at: datetime
    updated_at: datetime


class ModelPriceBody(BaseModel):
    """A model's price in USD per million tokens (REFLOOP_MODEL_PRICES' shape)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    input_usd_per_mtok: JsonFloat = Field(ge=0, le=1e6)
    output_usd_per_mtok: JsonFloat = Field(ge=0, le=1e6)


# A model config's window: at least what REFLOOP_MODEL_CONTEXT_TOKENS takes, at most ten
# million tokens (past any served model's, within the column's integer)
CONTEXT_TOKENS_MIN, CONTEXT_TOKENS_MAX = 256, 10_000_000
ContextTokens = Annotated[int, Field(ge=CONTEXT_TOKENS_MIN, le=CONTEXT_TOKENS_MAX),
                          BeforeValidator(_integral_float), Strict()]


class ModelConfigBase(BaseModel):
    name: str = Field(min_length=1, max_length=200)
    model: str = Field(min_length=1, max_length=200)
    base_url: str | None = Field(default=None, max_length=2000)
    # The name of the environment variable holding the key; keys never enter the API.
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Z_][A-Z0-9_]*$", max_length=200)
    temperature: float | None = Field(default=None, ge=0, le=2)
    # Its model's price (None: REFLOOP_MODEL_PRICES')
    price: ModelPriceBody | None = None
    # Its model's context window in tokens, ahead of REFLOOP_MODEL_CONTEXT_TOKENS and what
    # the endpoint states (None: those decide)
    context_tokens: ContextTokens | None = None


class ModelConfigCreate(ModelConfigBase):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [{
        "name": "small", "model": "gpt-4o-mini", "temperature": 0.2}]})


class ModelConfigUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(default=None, min_length=1, max_length=200)
    model: str = Field(default=None, min_length=1, max_length=200)
    base_url: str | None = Field(default=None, max_length=2000)
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Z_][A-Z0-9_]*$", max_length=200)
    temperature: float | None = Field(default=None, ge=0, le=2)
    price: ModelPriceBody | None = None
    context_tokens: ContextTokens | None = None


class ModelConfigPublic(ModelConfigBase):
    id: int
    created_at: datetime
    updated_at: datetime


class QualityReviewPublic(BaseModel):
    id: int
    session_id: str | None
    task_id: str
    file_path: str
    passed: bool = Field(serialization_alias="pass")
    outcome: str
    reasons: list[str]
    suggestions: str
    summary: str
    created_at: datetime


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    temporal: bool
    database: bool
    detail: dict[str, str] = Field(default_factory=dict)


class BudgetBody(BaseModel):
    """A task's new spend limit: totals with its children's spend, not increments; one
    left out stays as it was. Refused (409) below what the task has spent."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"max_cost_usd": 5.0}, {"max_tokens": 2000000}]})

    max_cost_usd: LimitUsd | None = None
    max_tokens: LimitTokens | None = None


class TaskBudget(BaseModel):
    task_id: str
    max_cost_usd: float | None = None
    max_tokens: int | None = None
    cost_usd: float  # spent so far, its children's included
    tokens: int
    waiting: bool  # still waiting_for_budget: the new limit does not cover its next call
