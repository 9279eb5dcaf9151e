"""The code-review protocol: the unified task JSON, the Review and Verify
outputs, and the activity inputs/results of CodeReviewWorkflow."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from refloop.contract.activity_io import LLMUsageRecord
from refloop.contract.budget import BudgetState
from refloop.contract.hosts import HOST_ID_PATTERN
from refloop.contract.messages import TokenUsage

MAX_ATTEMPTS = 3
QUALITY_THRESHOLD = 50


class CodeReviewInput(BaseModel):
    # Generated when absent; a client's must match this pattern (no path from an ID).
    task_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
    review_type: Literal["diff", "file", "snippet"]
    working_directory: str = Field(max_length=4096)
    task_desc: str = ""
    priority_focus: list[str] = Field(default_factory=list)
    extra_requirements: list[str] = Field(default_factory=list)
    content: str | None = None  # the diff or the snippet
    file_paths: list[str] = Field(default_factory=list)  # review_type=file
    output_format: str = "detailed"  # detailed | simple | a free-text instruction
    model: str | None = None
    max_content_lines: int = Field(default=3000, ge=10)
    # The worker host holding the directory (GET /hosts): the content read runs on that
    # host's task queue. Optional: None reads on any worker, as before hosts existed.
    host: str | None = Field(default=None, pattern=HOST_ID_PATTERN)
    # How long a worker of the host may take to pick the read up before the review shows
    # `waiting_for_host` (None: 60 s).
    host_wait_s: float | None = Field(default=None, gt=0)
    # The review's spend limit (its own: a review is no task's child). Before each model
    # call (review, verify, a custom format) the limit must cover it, as a task's does;
    # else the review waits `waiting_for_budget` until the `raise_budget` update raises it,
    # `budget_wait_s` at most (None: 7 days), then ends incomplete.
    max_cost_usd: float | None = Field(default=None, gt=0)
    max_tokens: int | None = Field(default=None, gt=0)
    budget_wait_s: float | None = Field(default=None, gt=0)


class RetryContext(BaseModel):
    attempt_number: int = 1
    previous_errors: list[str] = Field(default_factory=list)
    recovery_actions_taken: list[str] = Field(default_factory=list)


class ReviewIssue(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    relevantFile: str  # noqa: N815 (protocol field name)
    existingCode: str = ""  # noqa: N815
    suggestionContent: str  # noqa: N815
    improvedCode: str = ""  # noqa: N815
    label: str = "Quality"
    suggestionLine: int  # noqa: N815
    severity: str = "Medium"


def _is_error_form(data: Any) -> bool:
    return isinstance(data, dict) and str(data.get("status", "")).upper() == "ERROR" \
        and bool(data.get("message"))


def _require(data: Any, field: str, what: str) -> Any:
    """Defaults stay for reading stored reports, but a model's answer must state the
    field: `{}` is not a review with zero findings, it is an invalid answer."""
    if isinstance(data, dict) and data.get(field) is None and not _is_error_form(data):
        raise ValueError(f"'{field}' is required ({what}); an error needs status ERROR "
                         "and a message")
    return data


class ReviewOutput(BaseModel):
    """The Review agent's findings, or the error form (`status: ERROR`, `message`)."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="before")
    @classmethod
    def _issues_present(cls, data: Any) -> Any:
        return _require(data, "issues", "a list, empty when nothing was found")

    task_id: str = ""
    issues: list[ReviewIssue] = Field(default_factory=list)
    summary: dict[str, Any] = Field(default_factory=dict)
    status: str | None = None
    message: str | None = None


class AccuracyCheck(BaseModel):
    model_config = ConfigDict(extra="allow")

    issue_id: str
    accuracy_status: str = "CORRECT"
    evidence: str = ""
    deletion_required: bool = False
    deletion_reason: str | None = None


class ComplianceCheck(BaseModel):
    model_config = ConfigDict(extra="allow")

    issue_id: str
    compliance_status: str = "COMPLIANT"
    violated_rules: list[str] = Field(default_factory=list)
    deletion_required: bool = False
    violation_reason: str | None = None


class MissingIssue(BaseModel):
    model_config = ConfigDict(extra="allow")

    description: str
    evidence: str = ""
    suggested_severity: str = "Medium"


class QualityAssessment(BaseModel):
    model_config = ConfigDict(extra="allow")

    overall_score: int
    quality_level: str = ""
    strengths: list[str] = Field(default_factory=list)
    weaknesses: list[str] = Field(default_factory=list)
    missing_issues: list[MissingIssue] = Field(default_factory=list)


class VerificationResult(BaseModel):
    accuracy_check: list[AccuracyCheck] = Field(default_factory=list)
    rule_compliance_check: list[ComplianceCheck] = Field(default_factory=list)
    quality_assessment: QualityAssessment


class VerifyOutput(BaseModel):
    """The Verify agent's verdict, or the error form."""

    model_config = ConfigDict(extra="allow")

    task_id: str = ""
    verification_result: VerificationResult | None = None
    status: str | None = None
    message: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _verdict_present(cls, data: Any) -> Any:
        return _require(data, "verification_result",
                        "with quality_assessment.overall_score")


class ReviewContent(BaseModel):
    """What is under review: per-file text and the line numbers findings may cite.

    The text goes by reference: `files_ref` names it in the blob store (a payload of
    Temporal's stays small whatever the files weigh), and the lines are runs
    (`line_spans`, first and last). `files` and `lines` are what results recorded before
    carried inline."""

    files: dict[str, str] = Field(default_factory=dict)
    lines: dict[str, list[int]] = Field(default_factory=dict)
    skipped: list[str] = Field(default_factory=list)
    files_ref: str | None = None
    line_spans: dict[str, list[tuple[int, int]]] = Field(default_factory=dict)


class LoadContentInput(BaseModel):
    request: CodeReviewInput
    task_id: str


class AgentCallInput(BaseModel):
    task_json: dict[str, Any]
    content: ReviewContent
    review: ReviewOutput | None = None  # for Verify
    model: str | None = None


class AgentCallResult(BaseModel):
    """One sub-agent call: its parsed output, or why it could not be parsed."""

    review: ReviewOutput | None = None
    verify: VerifyOutput | None = None
    invalid: str | None = None  # invalid JSON or schema: a supervisor retry
    activity_id: str
    attempt: int
    # The call's usage and cost, every attempt's requests included (added later: None in
    # results recorded before)
    usage: LLMUsageRecord | None = None


class RecordContentInput(BaseModel):
    task_id: str
    review_type: str
    stage: Literal["content", "review", "verification"]
    payload: dict[str, Any]


class FormatInput(BaseModel):
    instruction: str
    report: dict[str, Any]
    model: str | None = None


class FormatResult(BaseModel):
    text: str
    usage: LLMUsageRecord | None = None  # as AgentCallResult's


class CodeReviewResult(BaseModel):
    task_id: str
    # incomplete: its spend limit stopped it and nobody raised it (`stop_reason` says so)
    status: Literal["completed", "failed", "incomplete"]
    output: Any  # the formatted report (detailed object, simple array, or text)
    attempts: list[dict[str, Any]] = Field(default_factory=list)
    provenance: list[dict[str, Any]] = Field(default_factory=list)  # activity ids per call
    dropped_hallucinations: int = 0
    skipped_content: list[str] = Field(default_factory=list)
    format_note: str | None = None
    # What its model calls used and cost (USD at the model's price; unpriced calls counted)
    usage: TokenUsage = Field(default_factory=TokenUsage)
    # Its limit at the end and its spend (None: it had no limit)
    budget: BudgetState | None = None
    stop_reason: str | None = None
