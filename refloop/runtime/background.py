"""A coroutine that runs beside a block and is cancelled when the block ends."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any


@contextlib.asynccontextmanager
async def in_background(work: Coroutine[Any, Any, Any]) -> AsyncIterator[None]:
    """Run `work` while the block runs; cancel it, and wait for it, when the block ends."""
    task = asyncio.create_task(work)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
