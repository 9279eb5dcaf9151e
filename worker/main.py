"""Worker process: connects to Temporal and runs the workflows and activities."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter
from temporalio.worker import UnsandboxedWorkflowRunner, Worker
from temporalio.worker.workflow_sandbox import SandboxRestrictions

from activities.code_review_activities import CodeReviewActivities
from activities.llm_activities import LLMActivities
from activities.mcp_activities import McpActivities
from activities.reflection_activities import ReflectionActivities
from activities.review_activities import ReviewActivities
from activities.store_activities import StoreActivities
from activities.tool_activities import ToolActivities
from activities.workspace_activities import WorkspaceActivities
from refloop.llm import LLMGateway
from refloop.mcp_pool import McpPool
from refloop.semantic import start_warm_up
from refloop.settings import Settings
from refloop.store import store_for
from refloop.telemetry import configure_tracing
from worker.runner import sandbox_runner
from workflows.agent import AgentTaskWorkflow
from workflows.code_review import CodeReviewWorkflow

log = logging.getLogger("refloop.worker")

WORKFLOWS = [AgentTaskWorkflow, CodeReviewWorkflow]

# Pure, stateless decision modules (and the refloop core they import) are shared with the
# sandbox instead of being re-imported for every workflow run; workflow classes stay
# sandboxed.
SANDBOX_RESTRICTIONS = SandboxRestrictions.default.with_passthrough_modules(
    "refloop", "workflows.logic", "workflows.triggers", "workflows.review_logic",
    "workflows.completeness_logic", "workflows.code_review_logic", "workflows.policies",
    "workflows.state",
    "pydantic", "opentelemetry",
)


# Core SDK warnings would drown the CLI's progress.
RUNTIME = Runtime(
    telemetry=TelemetryConfig(
        logging=LoggingConfig(filter=TelemetryFilter(core_level="ERROR", other_level="ERROR"))
    )
)


async def connect(address: str, namespace: str) -> Client:
    configure_tracing()
    # Workers built on this client inherit the interceptor: one trace per task.
    return await Client.connect(
        address, namespace=namespace, data_converter=pydantic_data_converter, runtime=RUNTIME,
        interceptors=[TracingInterceptor()],
    )


class RefloopWorker(Worker):
    """A worker that stops its pooled MCP servers when it stops."""

    def __init__(self, *args: Any, mcp_pool: McpPool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.mcp_pool = mcp_pool

    async def run(self) -> None:
        try:
            await super().run()
        finally:
            await self.mcp_pool.close()


def build_worker(client: Client, settings: Settings, task_queue: str | None = None) -> Worker:
    """A worker with every workflow and activity, built with its dependencies."""
    gateway = LLMGateway(settings)
    database = store_for(settings.effective_database_url)
    llm = LLMActivities(gateway, database)
    review = ReviewActivities(gateway)
    reflection = ReflectionActivities(gateway, database)
    tools = ToolActivities(settings, database)
    store = StoreActivities(database)
    code_review = CodeReviewActivities(gateway, store.store, settings.refloop_data_dir)
    workspace = WorkspaceActivities(settings, database)
    mcp = McpActivities(settings, database)
    return RefloopWorker(
        client,
        mcp_pool=mcp.pool,
        task_queue=task_queue or settings.refloop_task_queue,
        workflows=WORKFLOWS,
        activities=[
            llm.classify_intent,
            llm.make_plan,
            llm.act,
            llm.summarize,
            review.quality_review,
            reflection.check_completeness,
            reflection.plan_supplement,
            store.record_task,
            store.record_quality_review,
            code_review.load_content,
            code_review.review,
            code_review.verify,
            code_review.format_output,
            code_review.record_content,
            workspace.describe,
            workspace.index,
            *tools.activities(),
            *mcp.activities(),
        ],
        activity_executor=ThreadPoolExecutor(8),
        max_cached_workflows=settings.refloop_worker_max_cached_workflows,
        # On SIGTERM/SIGINT, in-flight activities get this long before they are cancelled.
        graceful_shutdown_timeout=timedelta(seconds=settings.refloop_graceful_shutdown_s),
        # A dead worker's cached workflows move to another worker after this (default 10 s).
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=3),
        workflow_runner=sandbox_runner(client.data_converter, SANDBOX_RESTRICTIONS)
        if settings.refloop_workflow_sandbox else UnsandboxedWorkflowRunner(),
    )


async def run_worker(settings: Settings) -> None:
    """`refloop worker`: needs TEMPORAL_ADDRESS; runs until cancelled (SIGTERM/SIGINT),
    then drains in-flight activities for the graceful shutdown timeout."""
    if not settings.temporal_address:
        raise SystemExit("refloop worker needs a Temporal server: set TEMPORAL_ADDRESS or "
                         "start `refloop up`")
    from worker.stack import model_endpoint

    if settings.refloop_semantic_index:  # loads while we connect
        start_warm_up(settings.refloop_embedding_model)
    client = await connect(settings.temporal_address, settings.temporal_namespace)
    with model_endpoint(settings) as effective:
        log.warning(
            "worker on %s, task queue %s, model endpoint %s",
            settings.temporal_address,
            settings.refloop_task_queue,
            effective.openai_base_url,
        )
        async with build_worker(client, effective):
            await asyncio.Event().wait()
