"""One rate limit for the fleet: model calls run on their own task queue, and the Temporal
server holds them to REFLOOP_LLM_RATE_PER_S whichever worker polls."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import pytest

from refloop.contract.hosts import model_queue
from refloop.contract.task import TaskInput
from refloop.runtime.client import connect
from refloop.worker.main import build_worker
from refloop.workflows.agent import AgentTaskWorkflow
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import CODING, SUMMARY, call, final, plan_of, result_of

pytestmark = pytest.mark.slow


async def test_twenty_model_calls_over_two_workers_keep_to_two_a_second(
        temporal_server, client, settings, scripted_llm, workspace, task_queue):
    limited = settings.model_copy(update={"refloop_llm_rate_per_s": 2.0})
    (workspace / "a.txt").write_text("a\n")
    async with contextlib.AsyncExitStack() as stack:
        for host in ("r1", "r2"):  # two workers, each on its own connection
            own = await connect(temporal_server, "default")
            await stack.enter_async_context(build_worker(
                own, limited.model_copy(update={"refloop_host_id": host}), task_queue))
        handles = []
        started = time.monotonic()
        for _ in range(4):  # five model calls each: intent, plan, act, act, summary
            model = unique_scenario(scripted_llm, {
                "intent": [CODING], "plan": [plan_of("read_file")],
                "act": [call("read_file", path="a.txt"), final("read")],
                "summary": [SUMMARY]})
            handles.append(await client.start_workflow(
                AgentTaskWorkflow.run, TaskInput(task="read a.txt", workspace=str(workspace),
                                                 model=model, enable_reflection=False),
                id=f"test-{uuid.uuid4().hex[:10]}", task_queue=task_queue))
        results = await asyncio.gather(*(result_of(h) for h in handles))
        elapsed = time.monotonic() - started
    assert all(r.status == "completed" for r in results)
    waits, identities = [], set()
    for handle in handles:
        history = await handle.fetch_history()
        scheduled = {e.event_id: e for e in history.events
                     if e.HasField("activity_task_scheduled_event_attributes")}
        for e in history.events:
            if not e.HasField("activity_task_started_event_attributes"):
                continue
            attrs = e.activity_task_started_event_attributes
            origin = scheduled[attrs.scheduled_event_id]
            if origin.activity_task_scheduled_event_attributes.task_queue.name \
                    == model_queue(task_queue):
                identities.add(attrs.identity.split()[0].split("@")[-1])
                waits.append(e.event_time.ToDatetime().timestamp()
                             - origin.event_time.ToDatetime().timestamp())
    assert len(waits) == 20
    print(f"20 model calls at 2/s: {elapsed:.1f}s; longest queue wait {max(waits):.1f}s; "
          f"pollers {sorted(identities)}")
    # 20 calls at 2 a second: about 9.5 s at least; the wait is in Temporal's queue.
    assert elapsed >= 8.5, elapsed
    assert max(waits) >= 2.0 and sum(waits) >= 10.0, waits
