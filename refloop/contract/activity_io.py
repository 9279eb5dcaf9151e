"""The inputs and results of the activities (model calls, tool calls, reviews, records):
every one a pydantic model, new fields optional.
"""

from __future__ import annotations

from typing import Any, Literal, cast

from pydantic import (
    BaseModel,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    model_serializer,
)

from refloop.contract.budget import ModelPrice
from refloop.contract.checkpoints import CheckpointAfter, CheckpointTaken
from refloop.contract.lean import LeanModel
from refloop.contract.messages import (
    ChatMessage,
    IntentResult,
    Plan,
    Purpose,
    TokenUsage,
    ToolCall,
)
from refloop.contract.tool_properties import ToolProperties

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
    # The config's price (None: REFLOOP_MODEL_PRICES'); added later, optional
    price: ModelPrice | None = None
    # The config's context window in tokens (None: REFLOOP_MODEL_CONTEXT_TOKENS, else the
    # endpoint's word); added later, optional
    context_tokens: int | None = None


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
    # Every tool of the catalogue, `tool_names` left empty: the usual list is 170 bytes of
    # every step's history (False in runs recorded before)
    every_tool: bool = False
    mcp_tools_ref: str | None = None  # blob of the task's MCP tool specs (MCP names)
    conversation_ref: str | None = None
    max_history_messages: int = 400
    model: str | None = None
    endpoint: ModelEndpoint | None = None  # a model config's endpoint
    parallel_tool_calls: bool | None = None

    def tools(self) -> list[str] | None:
        """The tool names to offer; None: the whole catalogue."""
        return None if self.every_tool else self.tool_names


class ContextReport(BaseModel):
    """How a model turn's conversation was fitted to the endpoint's window."""

    window: int  # the endpoint's window, in tokens
    budget: int  # tokens the messages may take (the window less the answer's room, tools)
    tokens_before: int  # the conversation's estimate before the fit
    tokens: int  # what was sent
    masked: int = 0  # old tool outputs masked to a line each by this fit
    windowed: int = 0  # outputs the model read only in part
    folded: int = 0  # messages folded without a model, to make the request fit at all
    compact_due: bool = False  # past the summary threshold: a `compact` should follow


class ActResult(BaseModel):
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    finish_reason: str | None = None
    abnormal: str | None = None  # set when the output was runaway repetition
    usage: LLMUsageRecord
    conversation_ref: str | None = None  # the stored conversation this answer replied to
    # How the conversation was fitted to the window (refloop.llm.fitting); added later:
    # None in runs recorded before
    context: ContextReport | None = None


class SummarizeInput(BaseModel):
    task: str
    transcript: str
    model: str | None = None
    endpoint: ModelEndpoint | None = None  # a model config's endpoint


class SummarizeResult(BaseModel):
    summary: str
    usage: LLMUsageRecord


class ToolResult(LeanModel):
    ok: bool
    output: str = ""
    error: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)
    # Added with checkpoints taken by the tool's own activity (absent: none was taken
    # there; the workflow takes one apart if the call needs it): the workspace's
    # checkpoint after the call, or why it could not be taken
    checkpoint: CheckpointTaken | None = None


class RunToolInput(LeanModel):
    call_id: str  # deterministic: the idempotency key of the edit journal
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    workspace: str
    allow_network: bool = False
    allow_shell_operators: bool = False  # ; && || ` $() in run_cmd (off: one command per call)
    # The task's keywords: long read/grep/search outputs are windowed around them (sent to
    # the tools that window their output only).
    keywords: list[str] = Field(default_factory=list)
    # Added with checkpoints taken by the tool's own activity (absent: the workflow takes
    # one apart, as before): after the call, this activity checkpoints the workspace
    checkpoint: CheckpointAfter | None = None


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


class EditedFile(BaseModel):
    """An edited file as its reviewer sees it, read on the task's host: the snippet around
    the edit and what deterministic checks found (no model needed for those)."""

    file_path: str
    tool: str
    snippet: str = ""
    start_line: int | None = None
    end_line: int | None = None
    problems: list[str] = Field(default_factory=list)

    def review(self, **verdict: Any) -> QualityReview:
        return QualityReview(file_path=self.file_path, tool=self.tool,
                             start_line=self.start_line, end_line=self.end_line, **verdict)

    def failed_checks(self) -> QualityReview | None:
        """The review when the file is broken whatever the rules say, else None."""
        if not self.problems:
            return None
        return self.review(passed=False, outcome="deterministic_failed", reasons=self.problems,
                           suggestions="Fix these problems first.",
                           summary="deterministic check failed")


class JudgeEditInput(BaseModel):
    """The reviewer model's call on an edited file (on the model queue)."""

    task: str
    edited: EditedFile
    rules: str
    model: str | None = None
    endpoint: ModelEndpoint | None = None


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
    # The claimed files found missing, when read on the task's host beforehand (None: the
    # activity reads the workspace itself, as runs recorded before the split do).
    decisive: list[str] | None = None
    # Earlier calls' records, kept in the blob store (`KeepRecordsResult.ref`), oldest
    # first; `history` holds the calls since. Empty from runs of earlier code.
    history_refs: list[str] = Field(default_factory=list)


class ReadToolsInput(BaseModel):
    """Nothing to say yet: the worker's catalogue, whole."""


class ToolCatalogSnapshot(BaseModel):
    """The built-in tools a run uses, with their properties, in the model's order: read once
    at the run's start and kept in its state, so replay never depends on the code's
    current catalogue."""

    tools: dict[str, ToolProperties]

    @model_serializer(mode="wrap")
    def _compact(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Each tool without the properties its kind gives anyway (a catalogue in every
        task's history: 1.2 KB instead of 4.5); loading derives them again."""
        data = handler(self)
        tools = data.get("tools") if isinstance(data, dict) else None
        if not isinstance(tools, dict):
            return cast("dict[str, Any]", data)
        return {**data, "tools": {name: {key: value for key, value in props.items()
                                         if key == "kind" or value != _kind_default(props)[key]}
                                  for name, props in tools.items()}}


def _kind_default(props: dict[str, Any]) -> dict[str, Any]:
    defaults: dict[str, Any] = _PROPERTIES.dump_python(ToolProperties(kind=props["kind"]),
                                                       mode="json")
    return defaults


_PROPERTIES: TypeAdapter[ToolProperties] = TypeAdapter(ToolProperties)


class KeepRecordsInput(BaseModel):
    """Tool-call records a long task no longer carries in its state."""

    records: list[ToolRecord]
    # The links kept before these records, oldest first: the new blob names them, so a
    # task's state holds only the newest link (`KeptRecords`). Empty from runs of earlier
    # code, whose state lists every link itself.
    earlier: list[str] = Field(default_factory=list)


class KeptRecords(BaseModel):
    """A link of a task's chain of kept tool records, as stored (a blob): its records, and
    the links before it. A link stored by earlier code is the bare list of records."""

    earlier: list[str] = Field(default_factory=list)
    records: list[ToolRecord]


class KeepRecordsResult(BaseModel):
    ref: str  # the blob holding them, as JSON


class ClaimedFilesInput(BaseModel):
    workspace: str
    claimed_files: list[str]


class ClaimedFilesResult(BaseModel):
    """What the workspace says of the files the answer claims: the missing ones, worded."""

    missing: list[str] = Field(default_factory=list)


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
    # Approved with these arguments instead of the model's (checked like the model's own,
    # by the update's validator); None: as the model asked. Optional: updates sent before.
    arguments: dict[str, Any] | None = None


class RecordQualityReviewInput(BaseModel):
    task_id: str
    review_key: str  # deterministic per review: a retried write never duplicates a row
    session_id: str | None = None
    review: QualityReview


class HostCheckInput(BaseModel):
    """A task's host, checked against the hosts table when the task starts."""

    host: str
    workspace: str
