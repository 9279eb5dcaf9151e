"""Calling an activity (or a child workflow) from workflow code: name, result type and
options come from its `ActivityCall`; a call site passes only the argument, a summary and,
rarely, other options.

Where a call runs is the workflow's decision, asked of the `ActivityRouter` the workflow
hands its `Calls` object at its start (the agent's host phase, or `ModelQueueRouter`): a
model call on the fleet's model queue, a workspace call on its task's host queue. A
workspace call that no worker of its host picks up within the bound is not a failure: the
router is told (the task shows `waiting_for_host`) and the call is scheduled again, until
the host is back.

Cancellation: a cancelled task's call ends here in `asyncio.CancelledError`, never in an
activity or child error, so no caller's fail-open `except ActivityError` can swallow it.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel
from temporalio import workflow
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
    ChildWorkflowError,
    TimeoutType,
)
from temporalio.exceptions import TimeoutError as ActivityTimeout

with workflow.unsafe.imports_passed_through():
    from refloop.contract.activity_calls import ActivityCall
    from refloop.contract.errors import (
        EndpointParked,
        ModelUnavailable,
        ParkedCall,
        unavailable_message,
    )
    from refloop.contract.hosts import model_queue, next_wait
    from refloop.contract.policies import ActivityOptions

ArgT = TypeVar("ArgT", bound=BaseModel)
# A parked call goes again after its recheck at the latest (doubling, up to this), should
# no worker wake its task: every worker's probe wakes the tasks whose rows wait for it.
MAX_RECHECK = timedelta(minutes=5)
ResultT = TypeVar("ResultT")


class InterruptNow(Exception):
    """A waiting call was taken back: for a hand-over to a new build (the run continues as
    new, refloop.workflows.handover_phase) or a rewind (refloop.workflows.rewind_phase)."""


class ActivityRouter(Protocol):
    """What a workflow says about where its activities run."""

    def activity_queue(self, activity: ActivityCall[Any, Any]) -> str | None:
        """The task queue of `activity` (None: the workflow's own)."""

    def host_wait(self, activity: ActivityCall[Any, Any]) -> timedelta | None:
        """How long a worker of the host may take to pick the call up (None: no bound)."""

    async def host_waiting(self, waiting: bool, activity: ActivityCall[Any, Any],
                           waited: timedelta) -> None:
        """The host did not pick the call up within `waited` (True), or it is back (False)."""

    def host_moves(self) -> int:
        """How many times the task was moved to another host (a change: a waiting call is
        taken back and scheduled on the new host)."""

    def moved_argument(self, arg: ArgT) -> ArgT:
        """A waiting call's argument for the host the task moved to (its workspace there)."""

    async def after_move(self) -> None:
        """Before a waiting call goes to the host the task moved to: what that host needs
        first (the workspace put back from its latest checkpoint)."""

    async def before_call(self, activity: ActivityCall[Any, Any]) -> None:
        """Before `activity` is scheduled: a model call waits while the task's spend limit
        does not cover it."""

    async def model_answered(self) -> None:
        """A model call returned: a wait for its endpoint is over."""

    async def model_parked(self, parked: ParkedCall, failure: ActivityError) -> float:
        """A model call was parked (its endpoint is down, another call probes it): the task
        waits for the model. The seconds it has waited so far."""

    def model_backs(self) -> int:
        """How many times an endpoint was reported back: a parked call goes again at the
        next."""

    def interrupts(self, activity: ActivityCall[Any, Any]) -> bool:
        """Whether a call of `activity` that waits (for its endpoint, for its host) is taken
        back now, for a hand-over."""

    def call_claim(self, activity: ActivityCall[Any, Any]) -> str | None:
        """The activity id of a call about to be scheduled, if a move could take it back:
        its host's worker claims it before it runs (`hosts.CLAIM_UPDATE`). None: no claim."""

    def claimed(self, claim: str) -> bool:
        """Whether the host's worker claimed the call (it runs there: no move takes it)."""

    def call_ended(self, claim: str) -> None:
        """The call is over (or taken back): its claim is forgotten."""


class ModelQueueRouter:
    """The router of a workflow without a host: its model calls on the model queue."""

    _parked_since: datetime | None = None  # a parked model call waits since

    def activity_queue(self, activity: ActivityCall[Any, Any]) -> str | None:
        if activity.runs_on != "model":
            return None
        return model_queue(workflow.info().task_queue)

    def host_wait(self, activity: ActivityCall[Any, Any]) -> timedelta | None:
        return None

    async def host_waiting(self, waiting: bool, activity: ActivityCall[Any, Any],
                           waited: timedelta) -> None:
        return None

    def host_moves(self) -> int:
        return 0

    def moved_argument(self, arg: ArgT) -> ArgT:
        return arg

    async def after_move(self) -> None:
        return None

    async def before_call(self, activity: ActivityCall[Any, Any]) -> None:
        return None

    async def model_answered(self) -> None:
        self._parked_since = None

    async def model_parked(self, parked: ParkedCall, failure: ActivityError) -> float:
        if self._parked_since is None:
            self._parked_since = workflow.now()
        return (workflow.now() - self._parked_since).total_seconds()

    def model_backs(self) -> int:
        return 0

    def interrupts(self, activity: ActivityCall[Any, Any]) -> bool:
        return False

    def call_claim(self, activity: ActivityCall[Any, Any]) -> str | None:
        return None

    def claimed(self, claim: str) -> bool:
        return False

    def call_ended(self, claim: str) -> None:
        return None


def not_picked_up(err: ActivityError) -> bool:
    """No worker of the activity's task queue started it within its schedule-to-start bound."""
    cause = err.cause
    return isinstance(cause, ActivityTimeout) and cause.type == TimeoutType.SCHEDULE_TO_START


def cancelled(err: BaseException) -> bool:
    """A failure that only says the task was cancelled (an activity's, a local activity's,
    a child's)."""
    return isinstance(err.__cause__, CancelledError) or isinstance(
        getattr(err, "cause", None), CancelledError)


class Calls:
    """How a workflow calls its activities and children, each routed by the router it
    was built with (explicit: the phases call through the one object the workflow made)."""

    def __init__(self, router: ActivityRouter) -> None:
        self.router = router

    async def call(self, activity: ActivityCall[ArgT, ResultT], arg: ArgT, *,
                   summary: str | None = None, options: ActivityOptions | None = None,
                   local: bool | None = None) -> ResultT:
        """Run the activity and wait for its result. `local=False` schedules a local one
        (runs recorded before it became local replay so)."""
        await self.router.before_call(activity)
        try:
            result = await _call(self.router, activity, arg, summary, options, local)
        except (ActivityError, ApplicationError) as err:
            if cancelled(err):
                raise asyncio.CancelledError() from err
            raise
        if activity.runs_on == "model":
            await self.router.model_answered()
        return result

    def start(self, activity: ActivityCall[ArgT, ResultT], arg: ArgT, *,
              summary: str | None = None, bounded: bool = False,
              **extra: Any) -> workflow.ActivityHandle[ResultT]:
        """Start the activity and return its handle (it runs alongside the workflow; wait
        for it with `result`). `bounded`: it fails if no worker of its host picks it up
        within the host bound."""
        kwargs: dict[str, Any] = {**activity.options.kwargs(), **extra}
        kwargs["task_queue"] = self.router.activity_queue(activity)
        if bounded and kwargs["task_queue"]:
            kwargs["schedule_to_start_timeout"] = self.router.host_wait(activity)
        return workflow.start_activity(activity.name, arg, result_type=activity.result_type,
                                       summary=summary, **kwargs)

    @staticmethod
    async def result(handle: workflow.ActivityHandle[ResultT]) -> ResultT:
        """The result of a started activity (a cancelled task: `asyncio.CancelledError`)."""
        try:
            return await handle
        except ActivityError as err:
            if cancelled(err):
                raise asyncio.CancelledError() from err
            raise

    @staticmethod
    async def child(workflow_name: str, arg: Any, *, result_type: type[ResultT],
                    **options: Any) -> ResultT:
        """Run a child workflow and wait for its result (a cancelled task:
        `asyncio.CancelledError`)."""
        try:
            result: ResultT = await workflow.execute_child_workflow(
                workflow_name, arg, result_type=result_type, **options)
            return result
        except ChildWorkflowError as err:
            if cancelled(err):
                raise asyncio.CancelledError() from err
            raise


async def _call(router: ActivityRouter, activity: ActivityCall[ArgT, ResultT], arg: ArgT,
                summary: str | None, options: ActivityOptions | None,
                local: bool | None) -> ResultT:
    opts = options or activity.options
    result: ResultT  # what `activity` declares: the SDK's call by name returns Any
    if activity.local if local is None else local:
        result = await workflow.execute_local_activity(
            activity.name, arg, result_type=activity.result_type, summary=summary,
            **opts.local_kwargs())
        return result
    queue = router.activity_queue(activity)
    wait = router.host_wait(activity) if queue else None
    if wait is None:
        return await _unhosted_call(router, activity, arg, summary, opts, queue)
    waited: timedelta | None = None
    while True:
        moves = router.host_moves()
        # Scheduled while the task waits for its host: a move could take it back, so the
        # host's worker claims it first, and no move is accepted once it has.
        claim = router.call_claim(activity)
        handle = workflow.start_activity(
            activity.name, arg, result_type=activity.result_type, summary=summary,
            task_queue=queue, schedule_to_start_timeout=wait, activity_id=claim,
            **opts.kwargs())
        try:
            result = await _outcome(router, activity, handle, moves, claim, waited)
        except _TakenBack:  # not picked up within the bound, or the task moved meanwhile
            moved = router.host_moves() != moves
            if not moved:
                await router.host_waiting(True, activity, wait)
            # a moved task's host has a bound of its own (a host always has one)
            waited, wait = wait, ((router.host_wait(activity) or wait) if moved
                                  else next_wait(wait))
            queue = router.activity_queue(activity)  # a moved task: its new host
            if moved:  # and its workspace, at another path there if the move said so
                arg = router.moved_argument(arg)
                await router.after_move()
            continue
        finally:
            if claim is not None:
                router.call_ended(claim)
        return result


async def _unhosted_call(router: ActivityRouter, activity: ActivityCall[ArgT, ResultT],
                         arg: ArgT, summary: str | None, opts: ActivityOptions,
                         queue: str | None) -> ResultT:
    """A call with no host bound (a model call, a call on the workflow's own queue). A
    model call parked by its worker (its endpoint is down) waits here, holding no slot:
    until the endpoint is reported back, or its recheck (doubling up to MAX_RECHECK), then
    goes again; past the wait's bound it fails as ModelUnavailable."""
    rechecks = 0
    while True:
        backs = router.model_backs()
        handle = workflow.start_activity(
            activity.name, arg, result_type=activity.result_type, summary=summary,
            task_queue=queue, **opts.kwargs())
        parking = await _parking(router, activity, handle)
        if parking is None:
            result: ResultT = await handle  # what `activity` declares
            return result
        parked, failure = parking
        waited = await router.model_parked(parked, failure)
        if waited >= parked.bound_s:
            raise gave_up(failure, parked, waited)
        recheck = min(parked.recheck_s * 2 ** rechecks, MAX_RECHECK.total_seconds(),
                      parked.bound_s - waited)
        rechecks += 1
        await _until_back(router, activity, backs, timedelta(seconds=recheck))


async def _parking(router: ActivityRouter, activity: ActivityCall[Any, Any],
                   handle: workflow.ActivityHandle[Any]
                   ) -> tuple[ParkedCall, ActivityError] | None:
    """Once the call is done: what its worker said when it parked it, with the failure
    (None: not parked; its result or failure is the handle's)."""
    await workflow.wait_condition(lambda: handle.done() or router.interrupts(activity))
    if not handle.done():  # waiting for its endpoint: nothing of it was answered
        handle.cancel()
        raise InterruptNow()
    failure = handle.exception()
    if isinstance(failure, ActivityError):
        parked = parked_call(failure)
        if parked is not None:
            return parked, failure
    return None


async def _until_back(router: ActivityRouter, activity: ActivityCall[Any, Any], backs: int,
                      recheck: timedelta) -> None:
    """A parked call's wait: an endpoint reported back since it was scheduled, or its
    recheck; a hand-over or rewind takes it back."""
    with contextlib.suppress(asyncio.TimeoutError):
        await workflow.wait_condition(
            lambda: router.model_backs() > backs or router.interrupts(activity),
            timeout=recheck)
    if router.interrupts(activity):
        raise InterruptNow()


def parked_call(err: ActivityError) -> ParkedCall | None:
    """What a call parked by its worker says (None: the call failed otherwise)."""
    cause = err.cause
    if not isinstance(cause, ApplicationError) or cause.type != EndpointParked.__name__:
        return None
    details = cause.details[0] if cause.details else None
    if not isinstance(details, dict) or "parked" not in details:
        return None
    return ParkedCall.model_validate(details["parked"])


def gave_up(err: ActivityError, parked: ParkedCall, waited_s: float) -> ActivityError:
    """A parked call's failure once its wait passed the bound: the call's own failure, its
    cause ModelUnavailable naming the endpoint, as a probing call's is (the caller's stop
    reason and message read it). Its requests were counted when it parked."""
    message = unavailable_message(parked.endpoint, waited_s, parked.bound_setting,
                                  parked.bound_s, parked.error)
    failure = ActivityError(message, scheduled_event_id=err.scheduled_event_id,
                            started_event_id=err.started_event_id, identity=err.identity,
                            activity_type=err.activity_type, activity_id=err.activity_id,
                            retry_state=err.retry_state)
    failure.__cause__ = ApplicationError(message, {"status": parked.status},
                                         type=ModelUnavailable.__name__, non_retryable=True)
    return failure


class _TakenBack(Exception):
    """The call did not run: no worker of its host picked it up, or a move took it back."""


async def _outcome(router: ActivityRouter, activity: ActivityCall[ArgT, ResultT],
                   handle: workflow.ActivityHandle[ResultT], moves: int, claim: str | None,
                   waited: timedelta | None) -> ResultT:
    """The result of a call scheduled for a host, once it ran; `_TakenBack` if it did not.
    A call its host claims shows the host back at once (the call may run for long)."""
    back = waited is not None

    def claimed() -> bool:
        return claim is not None and router.claimed(claim)

    def settled() -> bool:
        return handle.done() or router.host_moves() != moves or (back and claimed()) or (
            router.interrupts(activity) and not claimed())

    try:
        await workflow.wait_condition(settled)
        if not handle.done() and router.interrupts(activity) and not claimed():
            handle.cancel()  # no worker of the host started it: it never ran
            raise InterruptNow()
        if not handle.done() and router.host_moves() == moves:  # claimed: the host is back
            await router.host_waiting(False, activity, waited or timedelta(0))
            back = False
            await workflow.wait_condition(handle.done)  # no move is accepted meanwhile
    except asyncio.CancelledError:  # the task is cancelled: so is the call, as before
        handle.cancel()
    moved = router.host_moves() != moves
    if moved and not handle.done():
        handle.cancel()
    try:
        result = await handle
    except ActivityError as err:
        if not_picked_up(err) or (moved and isinstance(err.cause, CancelledError)):
            raise _TakenBack() from err
        if back and not isinstance(err.cause, CancelledError):
            await router.host_waiting(False, activity, waited or timedelta(0))  # it ran
        raise
    if back:
        await router.host_waiting(False, activity, waited or timedelta(0))
    return result
