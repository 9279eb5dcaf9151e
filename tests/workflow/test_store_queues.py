"""Workers of different stores never share a queue unnoticed: each announces its store in
its identity, and a worker that sees a poller of another store on its queue says so,
loudly (the tasks would split between the two databases)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from pathlib import Path

import pytest
from temporalio.client import Client

from refloop.runtime.client import DATA_CONVERTER
from refloop.settings import Settings
from refloop.worker.main import serving
from refloop.worker.ownership import (
    FIRST_LOOK_AFTER_S,
    STORE_TAG,
    look_delays,
    queue_pollers,
)
from tests.workflow.helpers import wait_until


async def other_process_client(address: str) -> Client:
    """A client on its own SDK runtime, as another process has: the SDK refuses two
    workers of one queue on one runtime."""
    from temporalio.runtime import Runtime, TelemetryConfig

    return await Client.connect(address, data_converter=DATA_CONVERTER,
                                runtime=Runtime(telemetry=TelemetryConfig()))


async def polled_by(client, task_queue: str, store: str) -> None:
    async def seen() -> bool:
        return any(f"{STORE_TAG}{store}" in i for i in await queue_pollers(client, task_queue))

    await wait_until(seen, f"a poller of store {store} on {task_queue}")


async def test_a_worker_of_another_store_on_the_queue_is_reported(
        client, temporal_server: str, settings: Settings, task_queue: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture):
    # The other checkout: its own data dir, so its own SQLite store, and the same queue.
    other = settings.model_copy(update={"database_url": None,
                                        "refloop_data_dir": tmp_path / "other"})
    mine = settings.model_copy(update={"refloop_task_queue": task_queue})
    assert other.store_id != mine.store_id
    other_client = await other_process_client(temporal_server)
    with caplog.at_level(logging.ERROR, logger="refloop.ownership"):
        async with serving(other_client, other, task_queue):
            await polled_by(client, task_queue, other.store_id)
            other_polls = time.monotonic()  # its watch began a little before
            # Joining after the other worker's first look: it sees this one at a later
            # look of its schedule (the one after next at the latest: its watch began
            # before it was seen polling), well before its slow watch's minute.
            await asyncio.sleep(FIRST_LOOK_AFTER_S + 1)
            async with serving(client, mine):
                await polled_by(client, task_queue, mine.store_id)
                joined = time.monotonic() - other_polls
                looks = itertools.accumulate(look_delays())
                next(look for look in looks if look > joined)
                await wait_until(lambda: caplog.text.count("ANOTHER store") >= 2,
                                 "each worker's report of the other",
                                 timeout_s=next(looks) - joined + 10)
                await asyncio.sleep(0.5)  # no second report of the same worker
    reports = [r.getMessage() for r in caplog.records if "ANOTHER store" in r.getMessage()]
    assert len(reports) == 2, reports
    assert all(f"task queue {task_queue} is also polled" in r for r in reports)
    assert any(f"{STORE_TAG}{other.store_id}; this worker: {STORE_TAG}{mine.store_id}" in r
               for r in reports)
    assert any(f"{STORE_TAG}{mine.store_id}; this worker: {STORE_TAG}{other.store_id}" in r
               for r in reports)


async def test_workers_of_one_store_share_a_queue_quietly(
        client, temporal_server: str, settings: Settings, task_queue: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture):
    mine = settings.model_copy(update={"refloop_task_queue": task_queue})
    # Another worker of the same database, with its own data dir (another host, say).
    other = mine.model_copy(update={"refloop_data_dir": tmp_path / "other"})
    assert other.store_id == mine.store_id
    with caplog.at_level(logging.ERROR, logger="refloop.ownership"):
        async with serving(await other_process_client(temporal_server), other):
            await polled_by(client, task_queue, other.store_id)
            async with serving(client, mine):
                await asyncio.sleep(3)  # past each one's first look
    assert "ANOTHER store" not in caplog.text
