"""A live worker's long call is never timed out by its own heartbeats: they reach the
server every `HEARTBEAT_INTERVAL`, not at the SDK's default throttle (0.8 of the timeout,
which left a loaded worker 1.2 s of slack, and a retried model call paid for twice)."""

from __future__ import annotations

import asyncio

import pytest

from refloop.contract.policies import HEARTBEAT, HEARTBEAT_INTERVAL
from refloop.contract.task import TaskInput
from refloop.worker.main import build_worker
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import CODING, SUMMARY, final, plan_of, result_of, start

pytestmark = pytest.mark.slow

LONG_CALL_S = 9


async def test_a_long_model_call_beats_at_its_interval(client, settings, scripted_llm,
                                                       workspace, task_queue):
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("read_file")],
        "act": [{**final("answered slowly"), "delay_ms": LONG_CALL_S * 1000}],
        "summary": [SUMMARY]})
    beats: list[float] = []  # the server's last heartbeat time of the act call, as it moves
    async with build_worker(client, settings, task_queue):
        handle = await start(client, task_queue, TaskInput(
            task="answer", workspace=str(workspace), model=model, enable_reflection=False))
        deadline = asyncio.get_running_loop().time() + LONG_CALL_S + 60
        while asyncio.get_running_loop().time() < deadline:
            description = await handle.describe()
            if description.status is not None and description.status.name != "RUNNING":
                break
            for pending in description.raw_description.pending_activities:
                if (pending.activity_type.name == "refloop.llm.act"
                        and pending.HasField("last_heartbeat_time")):
                    beat = pending.last_heartbeat_time.ToDatetime().timestamp()
                    if not beats or beat != beats[-1]:
                        beats.append(beat)
            await asyncio.sleep(0.2)
        result = await result_of(handle)
    assert result.status == "completed", result.answer
    gaps = [later - earlier for earlier, later in zip(beats, beats[1:], strict=False)]
    assert len(beats) >= 3, beats
    # Each beat arrives about an interval after the last (2 s; the SDK's default: 4.8 s),
    # leaving a loaded worker seconds of the timeout.
    assert max(gaps) <= HEARTBEAT_INTERVAL.total_seconds() + 2.0 < HEARTBEAT.total_seconds(), gaps
