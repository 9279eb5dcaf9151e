"""Background heartbeats of long activity calls (a dead worker is noticed by them)."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.testing import ActivityEnvironment

from refloop.activities.heartbeat import heartbeating


async def beats_during(work_s: float, interval_s: float, fail: bool = False) -> int:
    beats: list[tuple] = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: beats.append(details)

    async def long_call() -> None:
        async with heartbeating(interval_s):
            await asyncio.sleep(work_s)
            if fail:
                raise RuntimeError("model call failed")

    await env.run(long_call)
    await asyncio.sleep(interval_s * 3)  # a leaked timer would beat on after the call
    return len(beats)


async def test_a_long_call_heartbeats_every_interval_and_stops_with_the_call():
    assert 3 <= await beats_during(0.35, 0.1) <= 4


async def test_a_short_call_costs_no_heartbeat():
    assert await beats_during(0.01, 0.1) == 0


async def test_a_failing_call_stops_heartbeating_and_keeps_its_error():
    with pytest.raises(RuntimeError, match="model call failed"):
        await beats_during(0.25, 0.1, fail=True)
