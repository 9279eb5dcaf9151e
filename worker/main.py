"""Worker process: connects to Temporal and runs the workflows and activities."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from sqlalchemy.exc import SQLAlchemyError
from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker

from refloop.activities.host_activities import FleetView
from refloop.contract import activity_calls
from refloop.contract.hosts import host_queue, model_queue
from refloop.contract.policies import HEARTBEAT_INTERVAL
from refloop.runtime.client import connect
from refloop.runtime.metrics import counting_tasks
from refloop.runtime.workspaces import workspace_roots
from refloop.settings import Settings
from refloop.store.db import Store, store_for
from refloop.store.fleet import fleet_llm_rate
from refloop.worker.admission import collector_tuned, slots_for
from refloop.worker.handover import taking_over, workflow_build_id
from refloop.worker.hosts import HostIdentity, guarded, host_presence
from refloop.worker.model_endpoint import model_endpoint
from refloop.worker.ownership import watching, worker_identity
from refloop.worker.plugin import activities_for, refloop_plugin
from refloop.worker.search_attributes import ensure_search_attributes

log = logging.getLogger("refloop.worker")

# Set, not derived: without it the SDK hashes the bytecode of every loaded module as the
# worker is built (about a sixth of a fresh worker's CPU). Nothing here versions on it.
BUILD_ID = "refloop"
# The search warm-up (LanceDB, onnxruntime, the embedding model: about a CPU-second)
# starts this long after the worker polls: a task already waiting takes its first steps
# first, and a task's first search comes several model calls in.
WARM_UP_AFTER_S = 1.0
FLEET_READ_RETRY_S = 2.0


class RefloopWorker:
    """One refloop worker: three Temporal workers on one client.

    - the shared queue: workflows and every activity (tasks without a host, and runs
      recorded before the host queues, schedule everything there);
    - the model queue: model calls, under the fleet's rate limit (REFLOOP_LLM_RATE_PER_S,
      which the Temporal server applies to the queue whichever worker polls). Every worker
      polls with the fleet's, read from the database at its start: one started without the
      setting takes it, one asking for another refuses to start (`refloop.store.fleet`).
      Without a fleet limit, tasks started since `patches.EAGER_MODEL_CALLS` keep their
      model calls on the shared queue (eager dispatch);
    - this host's queue: the workspace activities of tasks naming this host, refused
      outside its roots.

    `async with` runs them (with `announce`, the host's row is kept in the hosts table
    first) and gives the shared queue's worker.
    """

    def __init__(self, client: Client, settings: Settings, task_queue: str | None = None,
                 announce: bool = False) -> None:
        shared = task_queue or settings.task_queue
        host_id = settings.refloop_host_id
        # Histories show the host of every attempt; the store shows a foreign poller.
        self.host = HostIdentity(host_id, tuple(workspace_roots(settings)),
                                 (shared, model_queue(shared), host_queue(shared, host_id)),
                                 worker_identity(settings.store_id, host_id))
        self.settings, self.announce = settings, announce
        # Its own rate until __aenter__ reads the fleet's: a worker cannot lift it alone.
        self.fleet = FleetView(llm_rate_per_s=settings.refloop_llm_rate_per_s)
        self.client, self.queue = client, shared
        built = activities_for(settings, self.fleet)
        slots = slots_for(settings)
        common: dict[str, Any] = {
            # Every activity is async; threads start only if a sync one is ever added.
            "activity_executor": ThreadPoolExecutor(slots.activities),
            # Work past these waits in Temporal's queue, not in this process's event loop
            # (where it would delay the heartbeats of the calls already running).
            **slots.worker_kwargs(),
            "identity": self.host.identity,
            "build_id": BUILD_ID,
            # On SIGTERM/SIGINT, in-flight activities get this long before they are cancelled.
            "graceful_shutdown_timeout": timedelta(seconds=settings.refloop_graceful_shutdown_s),
            # Beats reach the server at their interval. The SDK's default holds them to 0.8
            # of the timeout, which left a loaded worker 1.2 s before a live call timed out.
            "max_heartbeat_throttle_interval": HEARTBEAT_INTERVAL,
        }
        self.shared = Worker(
            client, task_queue=shared,
            plugins=[refloop_plugin(settings, client.data_converter, built)],
            max_cached_workflows=settings.refloop_worker_max_cached_workflows,
            # A dead worker's cached workflows move to another worker after this (default 10 s).
            sticky_queue_schedule_to_start_timeout=timedelta(seconds=3),
            **common)
        activities = built[0]
        self._common = common
        self._model_activities = [fn for fn in activities if runs_on(fn) == "model"]
        self.on_host = Worker(
            client, task_queue=host_queue(shared, host_id),
            activities=[guarded(fn, self.host) for fn in activities
                        if runs_on(fn) == "workspace"], **common)
        self._stack = contextlib.AsyncExitStack()

    def _model_worker(self) -> Worker:
        """The model queue's worker, polling with the fleet's rate limit (Temporal applies
        the rate its pollers send to the whole queue)."""
        return Worker(self.client, task_queue=model_queue(self.queue),
                      activities=self._model_activities,
                      max_task_queue_activities_per_second=self.fleet.llm_rate_per_s,
                      **self._common)

    async def __aenter__(self) -> Worker:
        stack = self._stack
        store = store_for(self.settings.effective_database_url)
        self.fleet.llm_rate_per_s = await fleet_rate_when_readable(
            store, self.queue, self.settings.refloop_llm_rate_per_s, self.host.identity)
        self.model = self._model_worker()
        if self.announce:  # before polling: a task naming this host finds it at once
            await stack.enter_async_context(
                host_presence(store, self.host, self.settings.refloop_host_heartbeat_s))
        for worker in (self.shared, self.model, self.on_host):
            await stack.enter_async_context(worker)
        return self.shared

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()


async def fleet_rate_when_readable(store: Store, queue: str, asked: float | None,
                                   identity: str) -> float | None:
    """The fleet's model-call rate, once the database answers: a worker that polled
    without it could lift the fleet's limit, so a database outage at start is waited out."""
    while True:
        try:
            return await asyncio.to_thread(fleet_llm_rate, store, queue, asked, identity)
        except SQLAlchemyError as err:
            log.warning("cannot read the fleet's model-call rate from the database (%s); "
                        "trying again in %.0f s", str(err).splitlines()[0], FLEET_READ_RETRY_S)
            await asyncio.sleep(FLEET_READ_RETRY_S)


def runs_on(fn: Callable[..., Any]) -> str:
    """Where a registered activity runs (its ActivityCall's `runs_on`)."""
    return activity_calls.runs_on(activity._Definition.must_from_callable(fn).name)


def build_worker(client: Client, settings: Settings, task_queue: str | None = None,
                 announce: bool = False) -> RefloopWorker:
    """A worker with every workflow and activity (the refloop plugin), built with its
    dependencies; it stops its pooled MCP servers when it stops. `announce`: it records
    itself in the hosts table while it runs (`refloop worker`, `refloop up`)."""
    return RefloopWorker(client, settings, task_queue, announce)


@contextlib.asynccontextmanager
async def serving(client: Client, settings: Settings, task_queue: str | None = None,
                  warm_search: bool = False) -> AsyncIterator[Worker]:
    """A running worker, its queue watched for workers of another store; `warm_search`
    (the long-lived `refloop worker` and `refloop up`): the search warm-up is scheduled
    once it polls."""
    queue = task_queue or settings.task_queue
    build = settings.refloop_build_id or workflow_build_id()
    with collector_tuned():
        async with build_worker(client, settings, queue, announce=True) as worker, \
                watching(client, queue, settings.store_id), \
                taking_over(client, build, queue, settings.refloop_take_over_every_s), \
                counting_tasks(store_for(settings.effective_database_url),
                               settings.refloop_metrics_every_s):
            timer = None
            if warm_search and settings.refloop_semantic_index:
                from refloop.search.runtime import start_warm_up

                timer = asyncio.get_running_loop().call_later(
                    WARM_UP_AFTER_S, start_warm_up, settings.search_model)
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
