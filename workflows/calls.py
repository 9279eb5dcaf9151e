"""Calling an activity from workflow code: name, result type and options come from its
`ActivityCall`; a call site passes only the argument, a summary and, rarely, other options.

Where a call runs is the workflow's decision, asked here of the running workflow
(`ActivityRouter`, implemented by the agent's host phase): a model call on the fleet's
model queue, a workspace call on its task's host queue. A workspace call that no worker of
its host picks up within the bound is not a failure: the workflow is told (it shows
`waiting_for_host`) and the call is scheduled again, until the host is back.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel
from temporalio import workflow
from temporalio.exceptions import ActivityError, CancelledError, TimeoutType
from temporalio.exceptions import TimeoutError as ActivityTimeout

with workflow.unsafe.imports_passed_through():
    from refloop.contract.activity_calls import ActivityCall
    from refloop.contract.hosts import model_queue, next_wait
    from refloop.contract.policies import ActivityOptions
from refloop.workflows import patches

ArgT = TypeVar("ArgT", bound=BaseModel)
ResultT = TypeVar("ResultT")


class ActivityRouter(Protocol):
    """What a workflow says about where its activities run."""

    def activity_queue(self, activity: ActivityCall) -> str | None:
        """The task queue of `activity` (None: the workflow's own)."""

    def host_wait(self, activity: ActivityCall) -> timedelta | None:
        """How long a worker of the host may take to pick the call up (None: no bound)."""

    async def host_waiting(self, waiting: bool, activity: ActivityCall,
                           waited: timedelta) -> None:
        """The host did not pick the call up within `waited` (True), or it is back (False)."""

    def host_moves(self) -> int:
        """How many times the task was moved to another host (a change: a waiting call is
        taken back and scheduled on the new host)."""


class ModelQueueRouter:
    """The router of a workflow without a host: its model calls on the model queue."""

    def activity_queue(self, activity: ActivityCall) -> str | None:
        if activity.runs_on != "model" or not workflow.patched(patches.HOST_QUEUES):
            return None
        return model_queue(workflow.info().task_queue)

    def host_wait(self, activity: ActivityCall) -> timedelta | None:
        return None

    async def host_waiting(self, waiting: bool, activity: ActivityCall,
                           waited: timedelta) -> None:
        return None

    def host_moves(self) -> int:
        return 0


def _router() -> ActivityRouter | None:
    instance = workflow.instance()
    return instance if hasattr(instance, "activity_queue") else None


def not_picked_up(err: ActivityError) -> bool:
    """No worker of the activity's task queue started it within its schedule-to-start bound."""
    cause = err.cause
    return isinstance(cause, ActivityTimeout) and cause.type == TimeoutType.SCHEDULE_TO_START


async def call_activity(activity: ActivityCall[ArgT, ResultT], arg: ArgT, *,
                        summary: str | None = None, options: ActivityOptions | None = None,
                        local: bool | None = None) -> ResultT:
    """Run the activity and wait for its result. `local=False` schedules a local one
    (runs recorded before it became local replay so)."""
    opts = options or activity.options
    if activity.local if local is None else local:
        return await workflow.execute_local_activity(
            activity.name, arg, result_type=activity.result_type, summary=summary,
            **opts.local_kwargs())
    router = _router()
    queue = router.activity_queue(activity) if router is not None else None
    wait = router.host_wait(activity) if router is not None and queue else None
    if router is None or wait is None:
        return await workflow.execute_activity(
            activity.name, arg, result_type=activity.result_type, summary=summary,
            task_queue=queue, **opts.kwargs())
    waited: timedelta | None = None
    while True:
        moves = router.host_moves()
        handle = workflow.start_activity(
            activity.name, arg, result_type=activity.result_type, summary=summary,
            task_queue=queue, schedule_to_start_timeout=wait, **opts.kwargs())
        # A task moved to another host while this call waits: the call is taken back from
        # the old host's queue (nobody picked it up) and scheduled on the new one.
        try:
            await workflow.wait_condition(
                lambda: handle.done() or router.host_moves() != moves)  # noqa: B023
        except asyncio.CancelledError:  # the task is cancelled: so is the call, as before
            handle.cancel()
        moved = router.host_moves() != moves
        if moved and not handle.done():
            handle.cancel()
        try:
            result = await handle
        except ActivityError as err:
            if not_picked_up(err) or (moved and isinstance(err.cause, CancelledError)):
                if not moved:
                    await router.host_waiting(True, activity, wait)
                waited, wait = wait, (router.host_wait(activity) if moved else next_wait(wait))
                queue = router.activity_queue(activity)  # a moved task: its new host
                continue
            if waited is not None and not isinstance(err.cause, CancelledError):
                await router.host_waiting(False, activity, waited)  # it ran, then failed
            raise
        if waited is not None:
            await router.host_waiting(False, activity, waited)
        return result


def start_activity(activity: ActivityCall[ArgT, ResultT], arg: ArgT, *,
                   summary: str | None = None, bounded: bool = False,
                   **extra: Any) -> workflow.ActivityHandle[ResultT]:
    """Start the activity and return its handle (it runs alongside the workflow).
    `bounded`: it fails if no worker of its host picks it up within the host bound."""
    kwargs: dict[str, Any] = {**activity.options.kwargs(), **extra}
    router = _router()
    if router is not None:
        kwargs["task_queue"] = router.activity_queue(activity)
        if bounded and kwargs["task_queue"]:
            kwargs["schedule_to_start_timeout"] = router.host_wait(activity)
    return workflow.start_activity(activity.name, arg, result_type=activity.result_type,
                                   summary=summary, **kwargs)
