"""Model calls in activities: core errors become Temporal failures (retryable or
non-retryable, with retry hints), and an endpoint outage is waited out between attempts.

Every model call of an activity runs under a ledger (`refloop.llm.ledger.RequestLedger`):
each HTTP request is counted as it goes out, heartbeated, carried into the next attempt
through the heartbeat details, and reported with the failure when the activity gives up,
so the workflow's stats count every request, answered or not. A call whose endpoint is
down ends its attempt at once (`refloop.llm.outage`), so it holds no worker slot while it
waits: the call that probes the endpoint is retried at the next probe (the wait's start
carried in its heartbeat, its task told `waiting_for_model` once, by a signal); an agent
task's other calls are parked (a failure that is not retried: the task waits in its
workflow) and woken by `ParkedWaker` when this worker sees the endpoint answer again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from datetime import timedelta
from typing import Any, TypeVar, cast

from temporalio import activity
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from refloop.activities.heartbeat import heartbeating
from refloop.contract import activity_calls
from refloop.contract.errors import EndpointParked, EndpointWaiting, LLMError
from refloop.contract.policies import LLM_CALL, REVIEW_CALL
from refloop.contract.task import MODEL_WAIT_SIGNAL, ModelWaitReport
from refloop.llm.ledger import RequestLedger, current_ledger
from refloop.llm.outage import OutageWatch, current_watch
from refloop.store.db import Store

attempt_log = logging.getLogger("refloop.attempts")
LEDGER_KEY = "refloop_ledger"
OUTAGE_KEY = "refloop_waiting_since"  # epoch seconds: the call waits for its endpoint
STATUS_KEY = "refloop_waiting_status"  # the HTTP status it waits out (401/403: shorter)
EPISODE_KEY = "refloop_waiting_episode"  # the outage its task was told of
AGENT_WORKFLOW = "AgentTaskWorkflow"
# Model calls whose policy is a small budget: they fail (open) rather than wait.
BOUNDED_MODEL_CALLS = frozenset({activity_calls.QUALITY_REVIEW.name,
                                 activity_calls.JUDGE_EDIT.name})

T = TypeVar("T")


def to_application_error(err: LLMError, ledger: RequestLedger | None = None) -> ApplicationError:
    """Keep the class name as the failure type so retry policies can match on it; the
    details carry the usage of every request this activity made (all attempts)."""
    delay = timedelta(seconds=err.retry_after) if err.retry_after else None
    details: dict[str, Any] = {"status": err.status}
    record = ledger.record() if ledger is not None else None
    if record is not None:
        details["usage"] = record.model_dump(mode="json")
    if isinstance(err, EndpointParked):
        details["parked"] = err.parked.model_dump(mode="json")
    return ApplicationError(
        str(err),
        details,
        type=type(err).__name__,
        non_retryable=not err.retryable,
        next_retry_delay=delay,
        # A wait for a down endpoint is the plan, not a failure: the SDK logs it at debug
        # level with no traceback (hundreds of waiting calls wrote one each per probe)
        category=ApplicationErrorCategory.BENIGN if waits(err)
        else ApplicationErrorCategory.UNSPECIFIED,
    )


def waits(err: LLMError) -> bool:
    """The call waits for its endpoint (retried at the next probe, or parked)."""
    return isinstance(err, EndpointWaiting | EndpointParked)




def _carried_ledger() -> RequestLedger:
    """The ledger earlier attempts of this activity left in their heartbeat details."""
    details = activity.info().heartbeat_details
    for item in details or ():
        if isinstance(item, dict) and LEDGER_KEY in item:
            return RequestLedger.load(item[LEDGER_KEY])
    return RequestLedger()


def _policy() -> RetryPolicy:
    """The activity's retry policy as the server reports it, else the named one it was
    scheduled with (not every server version sends it to the worker)."""
    info = activity.info()
    if info.retry_policy is not None:
        return info.retry_policy
    return REVIEW_CALL.retry if info.activity_type == activity_calls.QUALITY_REVIEW.name \
        else LLM_CALL.retry


def _next_retry(err: LLMError) -> str:
    """"retrying in 4 s" / "giving up", from the activity's retry policy."""
    info = activity.info()
    policy = _policy()
    maximum = policy.maximum_attempts
    if not err.retryable or (maximum and info.attempt >= maximum):
        return "giving up"
    if err.retry_after:
        return f"retrying in {err.retry_after:g} s"
    delay = policy.initial_interval.total_seconds() * (
        policy.backoff_coefficient ** (info.attempt - 1))
    if policy.maximum_interval is not None:
        delay = min(delay, policy.maximum_interval.total_seconds())
    return f"retrying in {delay:g} s"


def log_failed_attempt(err: LLMError) -> None:
    """One line per failed attempt: "act attempt 2/6 failed: HTTP 500 ...; retrying in 4 s"."""
    info = activity.info()
    maximum = _policy().maximum_attempts
    name = info.activity_type.rsplit(".", 1)[-1]
    of = f"/{maximum}" if maximum else ""
    # The worker log may quote the endpoint's own words; API clients never see them.
    said = f"{err}: {err.body}" if err.body else str(err)
    message = " ".join(said.split())[:240]
    attempt_log.warning("%s attempt %d%s failed: %s; %s", name, info.attempt, of, message,
                        _next_retry(err))


def _carried_details() -> dict[str, Any] | None:
    """What an earlier attempt of this call left in its heartbeat details."""
    for item in activity.info().heartbeat_details or ():
        if isinstance(item, dict) and LEDGER_KEY in item:
            return item
    return None


def _carried(key: str) -> Any:
    """A value an earlier attempt of this call left in its heartbeat details."""
    return (_carried_details() or {}).get(key)


def _carried_wait_start() -> float | None:
    """When this call began waiting for its endpoint, as an earlier attempt beat it."""
    since = _carried(OUTAGE_KEY)
    return float(since) if isinstance(since, int | float) else None


async def _tell_task(report: dict[str, Any]) -> None:
    """Tell the agent task its call waits for the model (or no longer): its status,
    event and row say so. Best effort: the wait goes on if Temporal cannot be reached."""
    info = activity.info()
    if info.workflow_type != AGENT_WORKFLOW or not info.workflow_id:
        return
    try:
        handle = activity.client().get_workflow_handle(info.workflow_id,
                                                       run_id=info.workflow_run_id)
        await handle.signal(MODEL_WAIT_SIGNAL, ModelWaitReport.model_validate(report))
    except Exception as err:  # noqa: BLE001 - a status update must not end the call
        attempt_log.warning("could not tell %s it waits for the model: %s",
                            info.workflow_id, err)


def _outage_watch() -> OutageWatch | None:
    """The call waits out an outage of its endpoint, unless its policy is a bounded
    budget (the quality review fails open instead)."""
    if activity.info().activity_type in BOUNDED_MODEL_CALLS:
        return None
    info = activity.info()
    parks = info.workflow_type == AGENT_WORKFLOW and bool(info.workflow_id)
    episode = _carried(EPISODE_KEY)
    watch = OutageWatch(since=_carried_wait_start(), notify=_tell_task,
                        waiter=info.workflow_id if parks else None,
                        told_episode=episode if isinstance(episode, str) else None)
    status = _carried(STATUS_KEY)
    watch.status = status if isinstance(status, int) else None
    return watch


async def _recorded_beat(details: dict[str, Any]) -> None:
    """Heartbeat details the server holds before this attempt fails: the SDK throttles
    beats, and one still pending when the attempt ends is dropped, so the next attempt
    would not see the requests this one made (their cost lost from the ledger)."""
    info = activity.info()
    try:
        await activity.client().get_async_activity_handle(
            task_token=info.task_token).heartbeat(details)
    except Exception as err:  # noqa: BLE001 - a beat must not hide the call's own failure
        attempt_log.warning("could not record the ledger of %s: %s", info.activity_id, err)


@contextlib.asynccontextmanager
async def model_ledger() -> AsyncIterator[RequestLedger]:
    """Heartbeating, with every model request of the block in a ledger carried across
    attempts, and the start of an outage wait with it; a failure is logged in one line
    and reported with the ledger's usage."""
    ledger = _carried_ledger()
    watch = _outage_watch()

    def details() -> dict[str, Any]:
        beat: dict[str, Any] = {LEDGER_KEY: ledger.dump()}
        if watch is not None and watch.since is not None:
            beat[OUTAGE_KEY] = watch.since
            beat[STATUS_KEY] = watch.status
            beat[EPISODE_KEY] = watch.told_episode
        return beat

    ledger.on_change = lambda _: activity.heartbeat(details())
    token = current_ledger.set(ledger)
    watching = current_watch.set(watch)
    try:
        async with heartbeating(details=details):
            try:
                yield ledger
            except LLMError as err:
                beat = details()
                # The next attempt starts from these; an attempt that only waited changed
                # nothing, and the server keeps the last ones: no beat, no server write. A
                # failure that is not retried carries its usage in its details instead.
                if err.retryable and beat != _carried_details():
                    activity.heartbeat(beat)  # a beat still pending is this one now
                    await _recorded_beat(beat)
                if not waits(err) or err.__cause__ is not None:
                    log_failed_attempt(err)  # a request failed (not a wait at the gate)
                raise to_application_error(err, ledger) from err
    finally:
        current_watch.reset(watching)
        current_ledger.reset(token)


async def call_model(call: Awaitable[T]) -> T:
    """Run one gateway call heartbeating, with its errors classified for Temporal. The
    result's `usage` becomes every request of this activity, earlier attempts included."""
    async with model_ledger() as ledger:
        result = await call
        usage = getattr(result, "usage", None)
        record = ledger.record(usage)
        if record is not None and usage is not None:
            cast(Any, result).usage = record  # T: a result with `usage` (getattr above)
        return result


class ParkedWaker:
    """Wakes the agent tasks parked on an endpoint once this worker sees it answer again:
    those parked here, and those whose rows say they wait for it (parked on another worker,
    or before this one restarted). Each gets the `model_wait` signal "back"; the signals go
    out beside the call that saw the answer, which returns at once."""

    CONCURRENT_SIGNALS = 16

    def __init__(self, store: Store) -> None:
        self.store = store
        self._sending: set[asyncio.Task[None]] = set()

    def wake(self, endpoint: str, parked: set[str]) -> None:
        client = activity.client()  # the calling activity's; the task outlives it
        task = asyncio.get_running_loop().create_task(self._wake(client, endpoint, parked))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _wake(self, client: Client, endpoint: str, parked: set[str]) -> None:
        try:
            rows = await asyncio.to_thread(self.store.waiting_for_model, endpoint)
        except Exception as err:  # noqa: BLE001 - those parked here are still woken
            attempt_log.warning("could not read the tasks waiting for %s: %s", endpoint, err)
            rows = []
        gate = asyncio.Semaphore(self.CONCURRENT_SIGNALS)
        report = ModelWaitReport(waiting=False, endpoint=endpoint)

        async def signal(workflow_id: str) -> None:
            async with gate:
                try:
                    await client.get_workflow_handle(workflow_id).signal(
                        MODEL_WAIT_SIGNAL, report)
                except Exception as err:  # noqa: BLE001 - its recheck wakes it instead
                    attempt_log.info("could not wake %s: %s", workflow_id, err)

        woken = {*parked, *rows}
        started = time.monotonic()
        await asyncio.gather(*(signal(workflow_id) for workflow_id in woken))
        attempt_log.info("%s answers again: woke %d waiting tasks in %.1f s", endpoint,
                         len(woken), time.monotonic() - started)
