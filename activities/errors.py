"""Turn core errors into Temporal failures: retryable or non-retryable, with retry hints."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from datetime import timedelta
from typing import TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from refloop.llm import LLMError

T = TypeVar("T")


def to_application_error(err: LLMError) -> ApplicationError:
    """Keep the class name as the failure type so retry policies can match on it."""
    delay = timedelta(seconds=err.retry_after) if err.retry_after else None
    return ApplicationError(
        str(err),
        {"status": err.status},
        type=type(err).__name__,
        non_retryable=not err.retryable,
        next_retry_delay=delay,
    )


# A third of the calls' heartbeat timeout (workflows/policies.py): two beats may be lost.
HEARTBEAT_INTERVAL_S = 2.0


@contextlib.asynccontextmanager
async def heartbeating(interval_s: float = HEARTBEAT_INTERVAL_S) -> AsyncIterator[None]:
    """Heartbeat in the background so a dead worker is noticed by the heartbeat timeout.
    A timer callback, not a task: most calls end before the first beat, and a busy
    worker runs thousands of them."""
    loop = asyncio.get_running_loop()
    timer: asyncio.TimerHandle | None = None

    def beat() -> None:
        nonlocal timer
        activity.heartbeat()
        timer = loop.call_later(interval_s, beat)

    timer = loop.call_later(interval_s, beat)  # runs in this activity's context
    try:
        yield
    finally:
        timer.cancel()


async def call_model(call: Awaitable[T]) -> T:
    """Run one gateway call heartbeating, with its errors classified for Temporal."""
    async with heartbeating():
        try:
            return await call
        except LLMError as err:
            raise to_application_error(err) from err
