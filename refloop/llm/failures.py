"""How a failed model request is classified: retryable transport errors (with the server's
retry hints) or non-retryable client errors.
"""

from __future__ import annotations

import email.utils
import logging
import re
import sys
from collections.abc import Mapping
from datetime import UTC, datetime

import openai

from refloop.contract.errors import LLMClientError, LLMError, LLMTransportError

log = logging.getLogger("refloop.llm")
RETRYABLE_STATUSES = frozenset({408, 409, 429})
ERROR_CLASS_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,39}")
def _body_text(err: openai.APIStatusError) -> str:
    try:
        return err.response.text if err.response is not None else str(err)
    except Exception:  # a streamed or closed body
        return str(err)


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds the endpoint asks us to wait: `retry-after-ms`, else `Retry-After` in
    seconds or as an HTTP date (as the openai client reads them)."""
    try:
        if (millis := headers.get("retry-after-ms")) is not None:
            return max(float(millis) / 1000, 0.0) or None
    except ValueError:
        pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(float(value), 0.0) or None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max((when - datetime.now(UTC)).total_seconds(), 0.0) or None


def should_retry(headers: Mapping[str, str]) -> bool | None:
    """The endpoint's own verdict (`x-should-retry: true|false`), which overrides the
    status code's; None when it gives none."""
    value = (headers.get("x-should-retry") or "").strip().lower()
    return {"true": True, "false": False}.get(value)


def error_class(err: openai.APIStatusError) -> str:
    """A short class for the failure: the body's `code` or `type` when it is an identifier
    (`scenario_exhausted`, `invalid_request_error`), else the client's exception name."""
    for value in (getattr(err, "code", None), getattr(err, "type", None)):
        if isinstance(value, str) and ERROR_CLASS_RE.fullmatch(value):
            return value
    return type(err).__name__


def classify(err: Exception) -> LLMError:
    """Map an openai exception onto our retryable / non-retryable errors."""
    if isinstance(err, openai.APITimeoutError):
        return LLMTransportError("model endpoint timed out (no answer within the client timeout)")
    if isinstance(err, openai.APIConnectionError):
        return LLMTransportError(f"model endpoint unreachable ({type(err).__name__})")
    if isinstance(err, openai.APIStatusError):
        status = err.status_code
        # The endpoint's own words stay in the worker log: a body can be anything a URL
        # chosen by an API client answers (an internal page), and task errors reach clients.
        message = f"HTTP {status} from the model endpoint ({error_class(err)})"
        body = _body_text(err)
        log.warning("%s: %s", message, " ".join(body.split())[:2000])
        headers = err.response.headers if err.response is not None else {}
        verdict = should_retry(headers)
        if verdict is None:
            # llama-cpp-python answers a request it cannot parse with a 500 "validation
            # error": retrying the same request cannot help.
            verdict = (status in RETRYABLE_STATUSES or status >= 500) and not (
                status >= 500 and "validation error" in body.lower())
        if verdict:
            error: LLMError = LLMTransportError(message, status, retry_after(headers))
        else:
            error = LLMClientError(message, status)
        error.body = body
        return error
    log.warning("model call failed: %r", err)
    return LLMTransportError(f"model call failed ({type(err).__name__})")


def abandoned_by(err: openai.OpenAIError) -> bool:
    """The request went out and its answer never came: a timeout, or a connection lost
    after it was sent (a refused connection reached no server)."""
    if isinstance(err, openai.APITimeoutError):
        return True
    return (isinstance(err, openai.APIConnectionError)
            and not isinstance(err.__cause__, _connect_errors()))


def _connect_errors() -> tuple[type[Exception], ...]:
    """The transport's "could not connect": httpx2's (openai 3), httpx's (openai 1 and 2).
    Whichever raised it is loaded; neither is imported for this."""
    return tuple(module.ConnectError for name in ("httpx2", "httpx")
                 if (module := sys.modules.get(name)) is not None)
