"""Every activity the workflows call, defined once: registered name, argument and result
types, and the timeouts and retries it runs under.

Activities register under `call.name`; workflows call through `workflows.calls`, which
reads the rest from here. A registered name never changes: workflows in flight and the
recorded histories name their activities by it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from refloop.contract import code_review as review
from refloop.contract.activity_io import (
    ActInput,
    ActResult,
    ClaimedFilesInput,
    ClaimedFilesResult,
    ClassifyIntentInput,
    ClassifyIntentResult,
    CompletenessInput,
    CompletenessResult,
    EditedFile,
    HostCheckInput,
    JudgeEditInput,
    KeepRecordsInput,
    KeepRecordsResult,
    MakePlanInput,
    MakePlanResult,
    QualityReviewInput,
    QualityReviewResult,
    ReadToolsInput,
    RecordQualityReviewInput,
    RunToolInput,
    SummarizeInput,
    SummarizeResult,
    SupplementPlanInput,
    ToolCatalogSnapshot,
    ToolResult,
)
from refloop.contract.checkpoints import (
    CheckpointInput,
    CheckpointResult,
    RestoreInput,
    RestoreResult,
)
from refloop.contract.hosts import ModelRoute, ModelRouteInput, RunsOn
from refloop.contract.mcp import McpCallInput, McpListInput, McpToolList
from refloop.contract.policies import (
    CHECKPOINT_CALL,
    HOST_CHECK,
    INDEX_CALL,
    LLM_CALL,
    MCP_CALL,
    MCP_LIST,
    REVIEW_CALL,
    REVIEW_CONTENT_READ,
    STORE_WRITE,
    TOOL_CATALOG_READ,
    WORKSPACE_CALL,
    ActivityOptions,
)
from refloop.contract.task import IndexReport, RecordTaskInput, WorkspaceDescription, WorkspaceInput
from refloop.contract.tool_catalog import TOOLS, tool_activity_options
from refloop.contract.window import CompactInput, CompactResult

ArgT = TypeVar("ArgT", bound=BaseModel)
ResultT = TypeVar("ResultT")


@dataclass(frozen=True)
class ActivityCall(Generic[ArgT, ResultT]):
    """One activity as its callers see it."""

    name: str
    arg_type: type[ArgT]
    result_type: type[ResultT] | None  # None: the activity returns nothing
    options: ActivityOptions
    local: bool = False  # run as a local activity (short, idempotent store writes)
    # Where it runs: the shared queue, the fleet's model queue (rate-limited), or the task's
    # host queue (it reads or writes the workspace; refloop.contract.hosts).
    runs_on: RunsOn = "shared"


CLASSIFY_INTENT = ActivityCall("refloop.llm.classify_intent", ClassifyIntentInput,
                               ClassifyIntentResult, LLM_CALL, runs_on="model")
MAKE_PLAN = ActivityCall("refloop.llm.make_plan", MakePlanInput, MakePlanResult, LLM_CALL,
                         runs_on="model")
ACT = ActivityCall("refloop.llm.act", ActInput, ActResult, LLM_CALL, runs_on="model")
SUMMARIZE = ActivityCall("refloop.llm.summarize", SummarizeInput, SummarizeResult, LLM_CALL,
                         runs_on="model")
# A summary of a conversation's older turns, when it nears the model's window
COMPACT = ActivityCall("refloop.llm.compact", CompactInput, CompactResult, LLM_CALL,
                       runs_on="model")
# Reads the workspace (do the files the answer names exist?) before its model call: runs
# recorded before the split into the two below.
CHECK_COMPLETENESS = ActivityCall("refloop.llm.check_completeness", CompletenessInput,
                                  CompletenessResult, LLM_CALL, runs_on="workspace")
CHECK_CLAIMED_FILES = ActivityCall("refloop.reflection.check_claimed_files", ClaimedFilesInput,
                                   ClaimedFilesResult, WORKSPACE_CALL, runs_on="workspace")
JUDGE_COMPLETENESS = ActivityCall("refloop.llm.judge_completeness", CompletenessInput,
                                  CompletenessResult, LLM_CALL, runs_on="model")
PLAN_SUPPLEMENT = ActivityCall("refloop.llm.plan_supplement", SupplementPlanInput,
                               MakePlanResult, LLM_CALL, runs_on="model")
# Reads the edited file before its model call: runs recorded before the split into the
# two below (the read on the task's host, the model call under the fleet's rate limit).
QUALITY_REVIEW = ActivityCall("refloop.review.quality_review", QualityReviewInput,
                              QualityReviewResult, REVIEW_CALL, runs_on="workspace")
READ_EDIT = ActivityCall("refloop.review.read_edit", QualityReviewInput, EditedFile,
                         WORKSPACE_CALL, runs_on="workspace")
JUDGE_EDIT = ActivityCall("refloop.review.judge_edit", JudgeEditInput, QualityReviewResult,
                          REVIEW_CALL, runs_on="model")
# An activity that returns nothing says so in its type: None alone names no type.
RECORD_TASK: ActivityCall[RecordTaskInput, None] = ActivityCall(
    "refloop.store.record_task", RecordTaskInput, None, STORE_WRITE, local=True)
READ_TOOL_CATALOG = ActivityCall("refloop.tools.read_catalog", ReadToolsInput,
                                 ToolCatalogSnapshot, TOOL_CATALOG_READ, local=True)
# Scheduled, not local: a database outage is retried by the server, adding no events.
KEEP_RECORDS = ActivityCall("refloop.store.keep_records", KeepRecordsInput, KeepRecordsResult,
                            STORE_WRITE)
RECORD_QUALITY_REVIEW: ActivityCall[RecordQualityReviewInput, None] = ActivityCall(
    "refloop.store.record_quality_review", RecordQualityReviewInput, None, STORE_WRITE,
    local=True)
DESCRIBE_WORKSPACE = ActivityCall("refloop.workspace.describe", WorkspaceInput,
                                  WorkspaceDescription, WORKSPACE_CALL, runs_on="workspace")
INDEX_WORKSPACE = ActivityCall("refloop.workspace.index", WorkspaceInput, IndexReport,
                               INDEX_CALL, runs_on="workspace")
# Taken on the task's host; restored on whichever host the workspace is to be on.
CHECKPOINT_WORKSPACE = ActivityCall("refloop.workspace.checkpoint", CheckpointInput,
                                    CheckpointResult, CHECKPOINT_CALL, runs_on="workspace")
RESTORE_WORKSPACE = ActivityCall("refloop.workspace.restore", RestoreInput, RestoreResult,
                                 CHECKPOINT_CALL, runs_on="workspace")
# MCP servers start in the task's workspace: on its host.
MCP_LIST_TOOLS = ActivityCall("refloop.mcp.list_tools", McpListInput, McpToolList, MCP_LIST,
                              runs_on="workspace")
MCP_CALL_TOOL = ActivityCall("refloop.mcp.call_tool", McpCallInput, ToolResult, MCP_CALL,
                             runs_on="workspace")
CHECK_HOST: ActivityCall[HostCheckInput, None] = ActivityCall(
    "refloop.hosts.check", HostCheckInput, None, HOST_CHECK, local=True)
# The fleet's model-call rate, from the worker running the task: eager model calls or not.
MODEL_ROUTE = ActivityCall("refloop.fleet.model_route", ModelRouteInput, ModelRoute, HOST_CHECK,
                           local=True)

# The code-review supervisor's
LOAD_REVIEW_CONTENT = ActivityCall("refloop.code_review.load_content", review.LoadContentInput,
                                   review.ReviewContent, REVIEW_CONTENT_READ,
                                   runs_on="workspace")
REVIEW_AGENT = ActivityCall("refloop.code_review.review", review.AgentCallInput,
                            review.AgentCallResult, LLM_CALL, runs_on="model")
VERIFY_AGENT = ActivityCall("refloop.code_review.verify", review.AgentCallInput,
                            review.AgentCallResult, LLM_CALL, runs_on="model")
FORMAT_REVIEW = ActivityCall("refloop.code_review.format_output", review.FormatInput,
                             review.FormatResult, LLM_CALL, runs_on="model")
# Scheduled (not local) as it always was: its recorded histories replay unchanged.
RECORD_REVIEW_CONTENT: ActivityCall[review.RecordContentInput, None] = ActivityCall(
    "refloop.code_review.record_content", review.RecordContentInput, None, STORE_WRITE)

TOOL_PREFIX = "refloop.tool."


def run_tool(name: str) -> ActivityCall[RunToolInput, ToolResult]:
    """A tool's activity: one per tool, so histories and the Web UI name it. Its timeouts
    and retries are the tool's properties (one attempt for a tool that is not safe to
    repeat)."""
    return ActivityCall(f"{TOOL_PREFIX}{name}", RunToolInput, ToolResult,
                        tool_activity_options(name).as_options(), runs_on="workspace")


FIXED: tuple[ActivityCall[Any, Any], ...] = (
    CLASSIFY_INTENT, MAKE_PLAN, ACT, SUMMARIZE, COMPACT, CHECK_COMPLETENESS, CHECK_CLAIMED_FILES,
    JUDGE_COMPLETENESS, PLAN_SUPPLEMENT, QUALITY_REVIEW, READ_EDIT, JUDGE_EDIT, RECORD_TASK,
    RECORD_QUALITY_REVIEW, DESCRIBE_WORKSPACE, INDEX_WORKSPACE,
    MCP_LIST_TOOLS, MCP_CALL_TOOL, LOAD_REVIEW_CONTENT, REVIEW_AGENT, VERIFY_AGENT,
    FORMAT_REVIEW, RECORD_REVIEW_CONTENT, CHECK_HOST, MODEL_ROUTE, CHECKPOINT_WORKSPACE,
    RESTORE_WORKSPACE, READ_TOOL_CATALOG, KEEP_RECORDS,
)


def runs_on(name: str) -> RunsOn:
    """Where the activity registered as `name` runs (a tool's: on the task's host)."""
    if name.startswith(TOOL_PREFIX):
        return "workspace"
    return next((call.runs_on for call in FIXED if call.name == name), "shared")


def every_call() -> dict[str, ActivityCall[Any, Any]]:
    """Every activity a workflow calls, by name (a tool's through `run_tool`)."""
    calls = {call.name: call for call in globals().values() if isinstance(call, ActivityCall)}
    calls.update({run_tool(name).name: run_tool(name) for name in TOOLS})
    return calls
