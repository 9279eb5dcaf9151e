"""Heartbeats of long activities: a dead worker's call is noticed by the heartbeat
timeout (`refloop.contract.policies.HEARTBEAT`) and retried elsewhere."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from temporalio import activity

from refloop.contract.policies import HEARTBEAT_INTERVAL


@contextlib.asynccontextmanager
async def heartbeating(interval_s: float = HEARTBEAT_INTERVAL.total_seconds(),
                       details: Callable[[], Any] | None = None) -> AsyncIterator[None]:
    """Heartbeat in the background so a dead worker is noticed by the heartbeat timeout.
    A timer callback, not a task: most calls end before the first beat, and a busy
    worker runs thousands of them."""
    loop = asyncio.get_running_loop()
    timer: asyncio.TimerHandle | None = None

    def beat() -> None:
        nonlocal timer
        if details is None:
            activity.heartbeat()
        else:
            activity.heartbeat(details())
        timer = loop.call_later(interval_s, beat)

    timer = loop.call_later(interval_s, beat)  # runs in this activity's context
    try:
        yield
    finally:
        timer.cancel()
