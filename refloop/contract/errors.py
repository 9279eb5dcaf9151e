"""The failures that retry policies name. Retry policies and activities take these
classes' names (`non_retryable(...)`), so a renamed class can never leave a policy
matching nothing.
"""

from __future__ import annotations

from pydantic import BaseModel


class LLMError(Exception):
    retryable = False

    def __init__(self, message: str, status: int | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        self.body = ""  # the endpoint's error body, for capability negotiation


class LLMTransportError(LLMError):
    """Timeouts, connection errors, 401/403/408/409/429, 5xx, a garbled or empty answer:
    the endpoint may recover, so the call waits it out (`refloop.llm.outage`)."""

    retryable = True


class LLMClientError(LLMError):
    """400/404/422 and other 4xx: retrying cannot help."""


class EndpointWaiting(LLMTransportError):
    """The call's endpoint is down: this attempt ends without holding its worker's slot, and
    Temporal tries again after `retry_after` (the next probe of the endpoint)."""


class EndpointParked(LLMError):
    """The call's endpoint is down and another call of this worker probes it: nothing was
    sent, and the attempt ends for good. Its task waits (a workflow-level wait: no slot, no
    retries) until the worker that sees the endpoint answer again wakes it, or `recheck_s`
    passes, then calls again."""

    def __init__(self, message: str, parked: ParkedCall) -> None:
        super().__init__(message, status=parked.status)
        self.parked = parked


class ParkedCall(BaseModel):
    """What a parked call's failure tells its workflow (the failure's details)."""

    endpoint: str  # as messages name it: no credentials
    error: str  # the endpoint's last error
    status: int | None = None
    bound_s: float  # the wait fails past this (REFLOOP_MODEL_OUTAGE_S, or the key's bound)
    bound_setting: str
    recheck_s: float  # call again after this long if nobody wakes the task first


def unavailable_message(endpoint: str, waited_s: float, setting: str, bound_s: float,
                        error: str) -> str:
    """Why a call gave up on its endpoint: the task's answer and its failure say this."""
    return (f"model endpoint {endpoint} unavailable for {waited_s:.0f} s, longer than "
            f"{setting} ({bound_s:g} s); last error: {error}")


class ModelUnavailable(LLMError):
    """The model endpoint stayed down (errors it may recover from) for longer than
    `REFLOOP_MODEL_OUTAGE_S`: the call gives up, naming the endpoint and its last error."""


class ModelRedirected(LLMClientError):
    """The endpoint answered a redirect. Never followed: the whole prompt would go to
    whatever the Location names (an open redirect on a bound endpoint, another origin)."""


class InvalidModelOutput(LLMError):
    """Structured output still invalid after the bounded re-asks, or an answer cut off at
    the token cap twice."""


class ToolError(Exception):
    """An expected failure: reported to the model as an error result, never raised further."""


class UnknownToolError(ToolError):
    """The registry has no such tool: a programming error, not something to retry."""


class McpConfigError(ValueError):
    """The configuration names no such server, or cannot be read; never retried."""


class InvalidApprovalEdit(ValueError):
    """Arguments a person edited before approving a call that its tool would refuse: the
    `decide_approval` update is refused with the reason, and the call still waits."""


class BadReviewInput(ValueError):
    """A code review's input cannot be reviewed (nothing to read, a bad diff)."""


def non_retryable(*errors: type[BaseException]) -> list[str]:
    """The failure types a retry policy must not retry: Temporal matches class names."""
    return [error.__name__ for error in errors]
