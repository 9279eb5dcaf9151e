"""Model calls in activities: core errors become Temporal failures (retryable or
non-retryable, with retry hints).

Every model call of an activity runs under a ledger (`refloop.llm.ledger.RequestLedger`):
each HTTP request is counted as it goes out, heartbeated, carried into the next attempt
through the heartbeat details, and reported with the failure when the activity gives up,
so the workflow's stats count every request, answered or not.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import activity
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

from refloop.activities.heartbeat import heartbeating
from refloop.contract import activity_calls
from refloop.contract.errors import LLMError
from refloop.contract.policies import LLM_CALL, REVIEW_CALL
from refloop.llm.ledger import RequestLedger, current_ledger

attempt_log = logging.getLogger("refloop.attempts")
LEDGER_KEY = "refloop_ledger"

T = TypeVar("T")


def to_application_error(err: LLMError, ledger: RequestLedger | None = None) -> ApplicationError:
    """Keep the class name as the failure type so retry policies can match on it; the
    details carry the usage of every request this activity made (all attempts)."""
    delay = timedelta(seconds=err.retry_after) if err.retry_after else None
    details: dict[str, Any] = {"status": err.status}
    record = ledger.record() if ledger is not None else None
    if record is not None:
        details["usage"] = record.model_dump(mode="json")
    return ApplicationError(
        str(err),
        details,
        type=type(err).__name__,
        non_retryable=not err.retryable,
        next_retry_delay=delay,
    )




def _carried_ledger() -> RequestLedger:
    """The ledger earlier attempts of this activity left in their heartbeat details."""
    details = activity.info().heartbeat_details
    for item in details or ():
        if isinstance(item, dict) and LEDGER_KEY in item:
            return RequestLedger.load(item[LEDGER_KEY])
    return RequestLedger()


def _beat(ledger: RequestLedger) -> None:
    activity.heartbeat({LEDGER_KEY: ledger.dump()})


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
    message = " ".join(str(err).split())[:240]
    attempt_log.warning("%s attempt %d%s failed: %s; %s", name, info.attempt, of, message,
                        _next_retry(err))


@contextlib.asynccontextmanager
async def model_ledger() -> AsyncIterator[RequestLedger]:
    """Heartbeating, with every model request of the block in a ledger carried across
    attempts; a failure is logged in one line and reported with the ledger's usage."""
    ledger = _carried_ledger()
    ledger.on_change = _beat
    token = current_ledger.set(ledger)
    try:
        async with heartbeating(details=lambda: {LEDGER_KEY: ledger.dump()}):
            try:
                yield ledger
            except LLMError as err:
                _beat(ledger)  # the next attempt starts from this ledger
                log_failed_attempt(err)
                raise to_application_error(err, ledger) from err
    finally:
        current_ledger.reset(token)


async def call_model(call: Awaitable[T]) -> T:
    """Run one gateway call heartbeating, with its errors classified for Temporal. The
    result's `usage` becomes every request of this activity, earlier attempts included."""
    async with model_ledger() as ledger:
        result = await call
        usage = getattr(result, "usage", None)
        record = ledger.record(usage)
        if record is not None and usage is not None:
            result.usage = record
        return result
