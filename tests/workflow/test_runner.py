"""The worker's sandbox runner: context lookups skipped only where they cannot matter,
and the sandbox still guarding workflow code."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

from temporalio import activity, workflow
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import (
    ActivitySerializationContext,
    PayloadCodec,
    SerializationContext,
    WithSerializationContext,
)
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

# This module defines workflows: the sandbox re-imports it, so its worker-side imports
# pass through (refloop's own workflow modules import only the contract).
with workflow.unsafe.imports_passed_through():
    from refloop.worker.main import build_worker
    from refloop.worker.plugin import SANDBOX_RESTRICTIONS
    from refloop.worker.runner import (
        ContextFreeSandboxedWorkflowRunner,
        ignores_serialization_context,
        sandbox_runner,
    )


class PlainCodec(PayloadCodec):
    """A codec that ignores context (most encryption codecs with one key)."""

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)


@dataclasses.dataclass
class ContextCodec(PayloadCodec, WithSerializationContext):
    """A codec that reads context (a key per workflow, say); it records each encoded
    payload with the context it was given."""

    seen: list[tuple[SerializationContext | None, bytes]]
    context: SerializationContext | None = None

    def with_context(self, context: SerializationContext) -> ContextCodec:
        return ContextCodec(self.seen, context)

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        self.seen.extend((self.context, payload.data) for payload in payloads)
        return list(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)


def with_codec(codec: PayloadCodec):
    return dataclasses.replace(pydantic_data_converter, payload_codec=codec)


@activity.defn(name="runner_test.echo")
async def echo(text: str) -> str:
    return text.upper()


@workflow.defn(name="RunnerTestEcho")
class EchoWorkflow:
    @workflow.run
    async def run(self, text: str) -> str:
        return await workflow.execute_activity(echo, text,
                                               start_to_close_timeout=timedelta(seconds=30))


@workflow.defn(name="RunnerTestClock")
class ClockWorkflow:
    @workflow.run
    async def run(self) -> str:
        return datetime.now().isoformat()  # non-deterministic: the sandbox must refuse it


def test_only_a_converter_that_reads_context_keeps_the_lookups():
    assert ignores_serialization_context(pydantic_data_converter)
    assert ignores_serialization_context(with_codec(PlainCodec()))
    assert not ignores_serialization_context(with_codec(ContextCodec([])))
    assert type(sandbox_runner(pydantic_data_converter, SANDBOX_RESTRICTIONS)) \
        is ContextFreeSandboxedWorkflowRunner
    assert type(sandbox_runner(with_codec(ContextCodec([])), SANDBOX_RESTRICTIONS)) \
        is SandboxedWorkflowRunner


async def test_the_agent_worker_uses_the_context_free_runner(client, settings, task_queue):
    async with build_worker(client, settings, task_queue) as worker:
        runner = worker.config(active_config=True)["workflow_runner"]
        assert type(runner) is ContextFreeSandboxedWorkflowRunner


async def test_a_context_reading_codec_still_gets_each_activity_context(temporal_server,
                                                                        task_queue):
    seen: list[tuple[SerializationContext | None, bytes]] = []
    converter = with_codec(ContextCodec(seen))
    client = await Client.connect(temporal_server, data_converter=converter)
    async with Worker(client, task_queue=task_queue, workflows=[EchoWorkflow],
                      activities=[echo],
                      workflow_runner=sandbox_runner(converter, SANDBOX_RESTRICTIONS)):
        result = await client.execute_workflow(EchoWorkflow.run, "hi", id=str(uuid.uuid4()),
                                               task_queue=task_queue)
    assert result == "HI"
    # The client encodes "hi" as the workflow's input, the workflow as the activity's:
    # each under its own context, never without one.
    contexts = [context for context, data in seen if data == b'"hi"']
    assert None not in contexts
    assert any(isinstance(context, ActivitySerializationContext)
               and context.activity_type == "runner_test.echo" for context in contexts)


async def test_the_context_free_runner_still_sandboxes_workflow_code(client, task_queue):
    runner = sandbox_runner(client.data_converter, SANDBOX_RESTRICTIONS)
    assert isinstance(runner, ContextFreeSandboxedWorkflowRunner)
    async with Worker(client, task_queue=task_queue, workflows=[EchoWorkflow, ClockWorkflow],
                      activities=[echo], workflow_runner=runner):
        assert await client.execute_workflow(
            EchoWorkflow.run, "hi", id=str(uuid.uuid4()), task_queue=task_queue) == "HI"
        handle = await client.start_workflow(ClockWorkflow.run, id=str(uuid.uuid4()),
                                             task_queue=task_queue)
        failure = None
        for _ in range(100):  # the task fails (and retries) instead of completing
            async for event in handle.fetch_history_events():
                if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                    failure = event.workflow_task_failed_event_attributes.failure.message
            if failure:
                break
            await asyncio.sleep(0.1)
        await handle.terminate()
    assert failure and "datetime.datetime.now" in failure, failure


async def test_the_plugin_registers_every_activity_the_workflows_call(client, settings,
                                                                     task_queue):
    """Names live in one catalogue: each is registered once, and nothing else is."""
    from temporalio import activity

    from refloop.contract import activity_calls
    from refloop.contract.tool_catalog import TOOLS

    async with build_worker(client, settings, task_queue) as worker:
        config = worker.config(active_config=True)
        names = [activity._Definition.must_from_callable(fn).name
                 for fn in config["activities"]]
        assert {w.__name__ for w in config["workflows"]} == {"AgentTaskWorkflow",
                                                             "CodeReviewWorkflow"}
    assert len(names) == len(set(names))
    expected = {call.name for call in activity_calls.FIXED}
    expected |= {activity_calls.run_tool(name).name for name in TOOLS}
    assert set(names) == expected


# An import of workflow code: `workflows`, `refloop.workflows` or `..workflows`, or
# `workflows` named in `from refloop import ...`.
WORKFLOW_IMPORT = re.compile(r"^\s*(?:(?:from|import)\s+(?:refloop\.|\.\.)?workflows\b"
                             r"|from\s+(?:refloop|\.\.)\s+import\s+.*\bworkflows\b)",
                             re.MULTILINE)


def test_activities_do_not_import_workflow_code():
    for line in ("from workflows import agent", "import workflows.agent",
                 "from refloop.workflows.agent import AgentWorkflow", "import refloop.workflows",
                 "    from ..workflows import logic", "from refloop import llm, workflows"):
        assert WORKFLOW_IMPORT.search(line), line
    assert not WORKFLOW_IMPORT.search("from refloop.contract import workflows_ids")
    root = Path(__file__).resolve().parents[2] / "activities"
    for source in root.glob("*.py"):
        text = source.read_text(encoding="utf-8")
        assert not WORKFLOW_IMPORT.search(text), source.name
