"""Everything a refloop worker needs, in one plugin: activities, workflows, the data
converter, the sandbox and its pass-through modules, and the tracing interceptor.

The worker (`refloop.worker.main.build_worker`), the replayer (`refloop.worker.replay`)
and the tests all register through `refloop_plugin`, so none of them can miss an activity
or a setting.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from temporalio.activity import _Definition as activity_defn  # the SDK's own reading
from temporalio.converter import DataConverter
from temporalio.plugin import SimplePlugin
from temporalio.worker import UnsandboxedWorkflowRunner, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxRestrictions

from refloop.activities.checkpoint_activities import CheckpointActivities
from refloop.activities.code_review_activities import CodeReviewActivities
from refloop.activities.host_activities import FleetView, HostActivities
from refloop.activities.llm_activities import LLMActivities
from refloop.activities.mcp_activities import McpActivities
from refloop.activities.model_calls import ParkedWaker
from refloop.activities.reflection_activities import ReflectionActivities
from refloop.activities.review_activities import ReviewActivities
from refloop.activities.store_activities import StoreActivities
from refloop.activities.tool_activities import ToolActivities
from refloop.activities.workspace_activities import WorkspaceActivities
from refloop.contract import activity_calls
from refloop.llm.gateway import LLMGateway
from refloop.runtime.client import DATA_CONVERTER, tracing_interceptor
from refloop.settings import Settings
from refloop.store.db import store_for
from refloop.worker.runner import sandbox_runner
from refloop.workflows.agent import AgentTaskWorkflow
from refloop.workflows.code_review import CodeReviewWorkflow

WORKFLOWS = [AgentTaskWorkflow, CodeReviewWorkflow]

# What workflow code imports (the layer contract allows only these): the contract and the
# pure, stateless decision modules are shared with the sandbox instead of being re-imported
# for every workflow run. Nothing else of refloop passes through, so I/O that creeps into
# workflow code meets the sandbox; workflow classes stay sandboxed.
SANDBOX_RESTRICTIONS = SandboxRestrictions.default.with_passthrough_modules(
    "refloop.contract", "refloop.workflows.logic", "refloop.workflows.accounting",
    "refloop.workflows.triggers",
    "refloop.workflows.review_logic", "refloop.workflows.completeness_logic",
    "refloop.workflows.code_review_logic", "refloop.workflows.state",
    "pydantic", "opentelemetry",
)
# A worker's sandbox also passes the workflow modules through: imported once per process
# instead of once per workflow run (34-45 CPU-ms a run, about a tenth of a short task's
# worker CPU; `python -m bench.sandbox_imports`). They hold no state of their own
# (constants, pure functions, classes whose instances are per run). The replayer keeps the
# stricter set above: `refloop replay` and the golden histories the tests replay re-import
# workflow code inside the sandbox, where a clock, I/O or randomness that crept in is
# refused.
WORKER_SANDBOX_RESTRICTIONS = SANDBOX_RESTRICTIONS.with_passthrough_modules("refloop.workflows")


# Every activity, and what closes them.
Built = tuple[list[Callable[..., Any]], Callable[[], Any]]


def signature_mismatches(activities: list[Callable[..., Any]]) -> list[str]:
    """Activities whose signature is not what their callers send and expect: workflows
    call by name, so only this check ties an `@activity.defn` to its `ActivityCall`."""
    calls = activity_calls.every_call()
    found = []
    for fn in activities:
        definition = activity_defn.must_from_callable(fn)
        call = calls.get(definition.name or "")
        if call is None:
            continue  # called by no workflow of ours (none today)
        expected = ([call.arg_type], call.result_type or type(None))
        actual = (list(definition.arg_types or []), definition.ret_type or type(None))
        if actual != expected:
            found.append(f"{definition.name}: takes {actual[0]} and returns {actual[1]}, "
                         f"its ActivityCall sends {expected[0]} and expects {expected[1]}")
    return found


def activities_for(settings: Settings, fleet: FleetView | None = None) -> Built:
    """Every activity, built with its dependencies, and what closes them (the MCP pool).
    `fleet`: the fleet's settings as the worker reads them at its start (else its own)."""
    gateway = LLMGateway(settings)
    database = store_for(settings.effective_database_url)
    gateway.on_endpoint_back = ParkedWaker(database).wake
    llm = LLMActivities(gateway, database)
    review = ReviewActivities(gateway)
    reflection = ReflectionActivities(gateway, database)
    tools = ToolActivities(settings, database)
    store = StoreActivities(database)
    code_review = CodeReviewActivities(gateway, store.store, settings.refloop_data_dir)
    workspace = WorkspaceActivities(settings, database)
    mcp = McpActivities(settings, database)
    hosts = HostActivities(database,
                           fleet or FleetView(llm_rate_per_s=settings.refloop_llm_rate_per_s))
    checkpoints = CheckpointActivities(settings, database)
    activities = [
        llm.classify_intent, llm.make_plan, llm.act, llm.summarize, llm.compact,
        review.quality_review, review.read_edit, review.judge_edit,
        reflection.check_completeness, reflection.check_claimed_files,
        reflection.judge_completeness, reflection.plan_supplement,
        store.record_task, store.record_quality_review, store.keep_records,
        code_review.load_content, code_review.review, code_review.verify,
        code_review.format_output, code_review.record_content,
        workspace.describe, workspace.index, hosts.check, hosts.model_route,
        tools.read_catalog, checkpoints.checkpoint, checkpoints.restore,
        *tools.activities(),
        *mcp.activities(),
    ]
    if mismatches := signature_mismatches(activities):
        raise TypeError("activities that do not match their calls: " + "; ".join(mismatches))
    return activities, mcp.pool.close


def refloop_plugin(settings: Settings | None = None,
                   converter: DataConverter = DATA_CONVERTER,
                   built: Built | None = None) -> SimplePlugin:
    """The worker's registrations; without `settings` (the replayer) no activities and
    the strict sandbox.
    `built`: activities made by `activities_for` already (shared with other queues)."""
    sandboxed = settings is None or settings.refloop_workflow_sandbox
    restrictions = SANDBOX_RESTRICTIONS if settings is None else WORKER_SANDBOX_RESTRICTIONS
    runner: WorkflowRunner = (sandbox_runner(converter, restrictions) if sandboxed
                              else UnsandboxedWorkflowRunner())
    activities: list[Callable[..., Any]] | None = None
    close: Callable[[], Any] | None = None
    if built is not None:
        activities, close = built
    elif settings is not None:
        activities, close = activities_for(settings)

    @asynccontextmanager
    async def closing() -> AsyncIterator[None]:
        try:
            yield
        finally:
            if close is not None:
                await close()

    return SimplePlugin(
        "refloop",
        data_converter=converter,
        interceptors=[tracing_interceptor()],
        activities=activities,
        workflows=WORKFLOWS,
        workflow_runner=runner,
        run_context=closing,
    )
