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


@contextlib.asynccontextmanager
async def heartbeating(interval_s: float = 5.0) -> AsyncIterator[None]:
    """Heartbeat in the background so a dead worker is noticed by the heartbeat timeout."""

    async def beat() -> None:
        # Sleep first: calls shorter than one interval cost no heartbeat RPC at all.
        while True:
            await asyncio.sleep(interval_s)
            activity.heartbeat()

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def call_model(call: Awaitable[T]) -> T:
    """Run one gateway call heartbeating, with its errors classified for Temporal."""
    async with heartbeating():
        try:
            return await call
        except LLMError as err:
            raise to_application_error(err) from err
