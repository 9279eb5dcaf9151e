"""A cancelled task's waiting activity call ends in `asyncio.CancelledError` from the one
call helper: a caller's `except ActivityError` (a fail-open branch) cannot swallow it."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

from pydantic import BaseModel
from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError
from temporalio.worker import Worker

from refloop.contract.activity_calls import ActivityCall
from refloop.contract.policies import ActivityOptions
from refloop.workflows.calls import Calls, ModelQueueRouter


class WaitInput(BaseModel):
    pass


WAIT_FOREVER = ActivityCall("test.wait_forever", WaitInput, None, ActivityOptions(
    start_to_close=timedelta(seconds=60), heartbeat=timedelta(seconds=2),
    retry=RetryPolicy(maximum_attempts=1)))
STARTED = asyncio.Event()


@activity.defn(name=WAIT_FOREVER.name)
async def wait_forever(inp: WaitInput) -> None:
    STARTED.set()
    while True:
        activity.heartbeat()
        await asyncio.sleep(0.2)


@workflow.defn(sandboxed=False)
class CallThenCatch:
    @workflow.run
    async def run(self) -> str:
        try:
            await Calls(ModelQueueRouter()).call(WAIT_FOREVER, WaitInput())
        except ActivityError:  # a fail-open branch, as phases have
            return "swallowed as an activity error"
        except asyncio.CancelledError:
            return "cancelled"
        return "finished"


async def test_a_cancelled_call_raises_cancelled_error(client, task_queue):
    STARTED.clear()
    async with Worker(client, task_queue=task_queue, workflows=[CallThenCatch],
                      activities=[wait_forever]):
        handle = await client.start_workflow(CallThenCatch.run, id=f"cancel-{uuid.uuid4().hex}",
                                             task_queue=task_queue)
        await asyncio.wait_for(STARTED.wait(), timeout=30)
        await handle.cancel()
        assert await asyncio.wait_for(handle.result(), timeout=30) == "cancelled"
