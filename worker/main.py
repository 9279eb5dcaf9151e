"""Worker process: connects to Temporal and runs the workflows and activities."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from temporalio.client import Client
from temporalio.worker import Worker

from refloop.runtime.client import connect
from refloop.settings import Settings
from refloop.worker.model_endpoint import model_endpoint
from refloop.worker.ownership import watching, worker_identity
from refloop.worker.plugin import refloop_plugin
from refloop.worker.search_attributes import ensure_search_attributes

log = logging.getLogger("refloop.worker")

# Set, not derived: without it the SDK hashes the bytecode of every loaded module as the
# worker is built (about a sixth of a fresh worker's CPU). Nothing here versions on it.
BUILD_ID = "refloop"
# The search warm-up (LanceDB, onnxruntime, the embedding model: about a CPU-second)
# starts this long after the worker polls: a task already waiting takes its first steps
# first, and a task's first search comes several model calls in.
WARM_UP_AFTER_S = 1.0


def build_worker(client: Client, settings: Settings, task_queue: str | None = None) -> Worker:
    """A worker with every workflow and activity (the refloop plugin), built with its
    dependencies; it stops its pooled MCP servers when it stops."""
    return Worker(
        client,
        task_queue=task_queue or settings.task_queue,
        # The store this worker writes to, so a worker of another store on its queue shows
        identity=worker_identity(settings.store_id),
        plugins=[refloop_plugin(settings, client.data_converter)],
        activity_executor=ThreadPoolExecutor(8),
        max_cached_workflows=settings.refloop_worker_max_cached_workflows,
        # On SIGTERM/SIGINT, in-flight activities get this long before they are cancelled.
        graceful_shutdown_timeout=timedelta(seconds=settings.refloop_graceful_shutdown_s),
        # A dead worker's cached workflows move to another worker after this (default 10 s).
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=3),
        build_id=BUILD_ID,
    )


@contextlib.asynccontextmanager
async def serving(client: Client, settings: Settings, task_queue: str | None = None,
                  warm_search: bool = False) -> AsyncIterator[Worker]:
    """A running worker, its queue watched for workers of another store; `warm_search`
    (the long-lived `refloop worker` and `refloop up`): the search warm-up is scheduled
    once it polls."""
    queue = task_queue or settings.task_queue
    async with build_worker(client, settings, queue) as worker, \
            watching(client, queue, settings.store_id):
        timer = None
        if warm_search and settings.refloop_semantic_index:
            from refloop.search.runtime import start_warm_up

            timer = asyncio.get_running_loop().call_later(
                WARM_UP_AFTER_S, start_warm_up, settings.refloop_embedding_model)
        try:
            yield worker
        finally:
            # A worker stopped within the delay never starts the load: cut off at exit
            # inside the model runtime's native threads, it would abort the process.
            if timer is not None:
                timer.cancel()


async def run_worker(settings: Settings) -> None:
    """`refloop worker`: needs TEMPORAL_ADDRESS; runs until cancelled (SIGTERM/SIGINT),
    then drains in-flight activities for the graceful shutdown timeout."""
    if not settings.temporal_address:
        raise SystemExit("refloop worker needs a Temporal server: set TEMPORAL_ADDRESS or "
                         "start `refloop up`")
    client = await connect(settings.temporal_address, settings.temporal_namespace)
    await ensure_search_attributes(client, settings.temporal_namespace)
    with model_endpoint(settings) as effective:
        log.warning(
            "worker on %s, task queue %s, store %s, model endpoint %s",
            settings.temporal_address,
            settings.task_queue,
            settings.store_id,
            effective.openai_base_url,
        )
        async with serving(client, effective, warm_search=True):
            await asyncio.Event().wait()
